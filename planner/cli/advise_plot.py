"""``batchplan advise --plot FILE.png``: cost per epoch against time per epoch of every candidate planned, the
front's points labelled, the dominated ones faint (needs the ``plot`` extra, matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.advise.search import SearchResult
from planner.cli.plot import _pyplot, _save


def plot_advice(result: SearchResult, front: list[dict[str, Any]], path: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    on_front = {id(p) for p in result.front}
    others = [p for p in result.evaluated if id(p) not in on_front]
    ax.scatter([p.time_per_epoch_s / 60 for p in others], [p.cost_per_epoch_usd for p in others],
               s=10, color="#4c72b0", alpha=0.15, label=f"planned, dominated ({len(others)})")
    xs = [p["time_per_epoch_s"] / 60 for p in front]
    ys = [p["cost_per_epoch_usd"] for p in front]
    ax.step(xs, ys, where="post", color="#dd8452", linewidth=1, alpha=0.6)
    for point, x, y in zip(front, xs, ys, strict=True):
        low, high = (t / 60 for t in point["time_per_epoch_range_s"])
        ax.errorbar([x], [y], xerr=[[x - low], [high - x]], fmt="o", color="#dd8452", capsize=3)
        ax.annotate(f"#{point['rank']} {point['cluster']}", (x, y), textcoords="offset points", xytext=(6, 4),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("time per epoch (min, log; bars: step-time model ±1σ)")
    ax.set_ylabel("cost per epoch (USD)")
    ax.set_title(f"batchplan advise: {len(front)} front points of {result.planned} planned, {result.candidates} candidates")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    return _save(fig, path)
