"""Pictures of a plan, of a profile and of advise's front (``--plot FILE.png``; needs the ``plot`` extra, matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from planner.cli.output import format_ms
from planner.errors import ConfigError
from planner.plan.types import Plan, RankEntry
from planner.profiles.profile import DeviceProfile
from torchkit.units import GIB


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib (pip install 'batchplan[plot]')") from exc
    return plt


def _save(fig, path: str) -> Path:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp.png")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        tmp.replace(target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"cannot write the picture to {target}: {exc.strerror or exc} (choose another --plot path)"
        ) from exc
    return target


#: one bar per rank up to this many ranks; past it one bar per GPU type (and speed), or the labels would be
#: too small to read
MAX_RANK_BARS = 48
_COLOURS = {
    "cap": "#d9d9d9",
    "batch": "#4c72b0",
    "total": "#eeeeee",
    "budget": "#c6dbef",
    "predicted": "#dd8452",
    "step": "#55a868",
    "sync": "#8c8c8c",
}


def _bars(plan: Plan) -> tuple[list[str], list[RankEntry]]:
    """Labels and figures of the bars: one per rank ("r0 node-a100 · A100-SXM4-80GB #0"), or per GPU type
    (and speed) with its rank and node counts when there are more than ``MAX_RANK_BARS`` ranks (the group's
    slowest rank is shown: it sets the step time)."""
    ranks = plan.ranks
    if len(ranks) <= MAX_RANK_BARS:
        return [f"r{r.rank}  {r.node} · {r.gpu} #{r.device_index}{_speed(r)}" for r in ranks], list(ranks)
    groups: dict[tuple[str, str], list[RankEntry]] = {}
    for r in ranks:
        groups.setdefault((r.gpu, _speed(r)), []).append(r)
    labels = [
        f"{gpu}{speed} ×{len(members)} on {len({m.node for m in members})} nodes (slowest shown)"
        for (gpu, speed), members in groups.items()
    ]
    return labels, [max(members, key=lambda r: r.predicted_step_time_s) for members in groups.values()]


def _speed(rank: RankEntry) -> str:
    """A rank's label suffix " (90% speed)" when other work keeps its GPU busy (planner.probing.busy)."""
    return f" ({rank.speed_factor:.0%} speed)" if rank.speed_factor < 1.0 else ""


def _annotate(ax, values: list[float], texts: list[str], *, past: float = 0.0) -> None:
    """The number at the end of each bar (or past ``past``, a line it must not cross), inside the axes: the
    x range leaves room for it."""
    for y, (value, text) in enumerate(zip(values, texts, strict=True)):
        ax.text(max(value, past), y, f" {text}", va="center", ha="left", fontsize=8)
    ax.set_xlim(0, max([*values, past], default=1) * 1.5 or 1)


def _panel(ax, title: str, ncol: int) -> None:
    """The panel's title, and under it, above the bars (outside them, clear of the tick labels), its legend."""
    ax.set_title(title, fontsize=10, pad=20)
    ax.legend(
        loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, fontsize=8, frameon=False, borderaxespad=0.2
    )


def check_plot_path(path: str) -> None:
    """``--plot``'s value names a PNG this run can write (checked before any work)."""
    from planner.cli.output import check_writable

    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot {path} must name a .png file (e.g. --plot plan.png)")
    check_writable("--plot", path)


def plot_plan(plan: Plan | dict, path: str) -> Path:
    """Draw ``plan_figure(plan)`` to ``path`` (PNG, written atomically)."""
    plt = _pyplot()
    fig = plan_figure(plan)
    path_out = _save(fig, path)
    plt.close(fig)
    return path_out


def plan_figure(plan: Plan):
    """One horizontal bar per rank (node / GPU type / device), three panels sharing the rows: the batch
    against its cap, memory predicted against budget and total, each rank's predicted compute and the exposed
    gradient sync up to the step (``_time_panel``). Numbers on the bars, legends outside them, model and cluster
    in the title."""
    plt = _pyplot()
    labels, rows = _bars(plan)
    y = list(range(len(rows)))
    height = max(3.2, 0.42 * len(rows) + 2.0)
    # constrained layout keeps the title, the panels' titles and their legends apart
    fig, (ax_batch, ax_mem, ax_time) = plt.subplots(
        1, 3, figsize=(16, height), sharey=True, layout="constrained"
    )

    caps = [r.max_batch for r in rows]
    batches = [r.batch for r in rows]
    ax_batch.barh(y, caps, color=_COLOURS["cap"], label="cap (largest batch that fits)")
    ax_batch.barh(y, batches, color=_COLOURS["batch"], height=0.6, label="planned batch")
    _annotate(ax_batch, caps, [f"{b} of {c}" for b, c in zip(batches, caps, strict=True)])
    _panel(ax_batch, "batch per step (samples)", 2)

    gib = {
        k: [getattr(r, f"{k}_bytes") / GIB for r in rows]
        for k in ("total_memory", "memory_budget", "predicted_memory")
    }
    ax_mem.barh(y, gib["total_memory"], color=_COLOURS["total"], label="total")
    ax_mem.barh(y, gib["memory_budget"], color=_COLOURS["budget"], label="budget")
    ax_mem.barh(y, gib["predicted_memory"], color=_COLOURS["predicted"], height=0.5, label="predicted")
    _annotate(
        ax_mem,
        gib["total_memory"],
        [
            f"{p:.1f} / {b:.1f} / {t:.0f} GiB"
            for p, b, t in zip(
                gib["predicted_memory"], gib["memory_budget"], gib["total_memory"], strict=True
            )
        ],
    )
    _panel(ax_mem, "memory, GiB (predicted / budget / total)", 3)

    _time_panel(ax_time, plan, rows, y)

    ax_batch.set_yticks(y)
    ax_batch.set_yticklabels(labels, fontsize=8)
    ax_batch.invert_yaxis()  # rank 0 on top, as in the table
    fig.suptitle(
        f"{plan.job.model} on {plan.cluster or 'cluster'} ({plan.mode}): {plan.world_size} ranks, global batch "
        f"{plan.global_batch} = {plan.step_batch} × accumulate {plan.accumulate}, "
        f"{plan.throughput_samples_per_s:,.0f} samples/s, balance efficiency {plan.balance_efficiency:.2f}",
        fontsize=11,
    )
    return fig


def _time_panel(ax, plan: Plan, rows: list[RankEntry], y: list[int]) -> None:
    """Each rank's compute, and the step every rank waits for: the slowest rank's compute plus the exposed
    gradient synchronisation (``predicted_step_time_s``), each part drawn and named with its figure; a plan
    without synchronisation (one GPU, written before the model) has none to draw."""
    compute_ms = [r.predicted_step_time_s * 1000 for r in rows]
    step_ms = plan.predicted_step_time_s * 1000
    slowest_ms = max(r.predicted_step_time_s for r in plan.ranks) * 1000  # every rank, not only the bars
    sync_ms = max(
        step_ms - slowest_ms, 0.0
    )  # the exposed sync per micro-step (per optimizer step / accumulate)
    ax.barh(y, compute_ms, color=_COLOURS["step"], label="rank's compute")
    if sync_ms > 0.005 * step_ms:  # below half a percent it would be a hairline
        ax.barh(
            y,
            [sync_ms] * len(y),
            left=slowest_ms,
            color=_COLOURS["sync"],
            hatch="//",
            edgecolor="white",
            linewidth=0,
            label=f"exposed sync {format_ms(sync_ms / 1000)} ms (every rank waits)",
        )
        step_label = (
            f"step {format_ms(step_ms / 1000)} ms = slowest compute {format_ms(slowest_ms / 1000)} + sync "
            f"{format_ms(sync_ms / 1000)}"
        )
        title = "predicted step time, ms (compute + exposed sync)"
    else:
        step_label = f"step {format_ms(step_ms / 1000)} ms (slowest rank's compute)"
        title = "predicted step time, ms"
    ax.axvline(step_ms, color="black", linestyle="--", linewidth=1, label=step_label)
    _annotate(
        ax,
        compute_ms,
        [f"{format_ms(r.predicted_step_time_s)} ms, idle {r.idle_fraction or 0.0:.0%}" for r in rows],
        past=step_ms,
    )
    named = sync_ms > 0.005 * step_ms  # three legend entries, one a row: they are long
    ax.set_title(title, fontsize=10, pad=44 if named else 20)
    ax.legend(
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=1 if named else 2,
        fontsize=8,
        frameon=False,
        borderaxespad=0.2,
    )


def plot_profile(
    profile: DeviceProfile,
    *,
    budget_bytes: int,
    total_bytes: int,
    chosen_batch: int,
    path: str,
    model: str = "",
) -> Path:
    """The memory curve of ``model`` with its probe points, the budget line and the chosen batch."""
    plt = _pyplot()
    top = max([chosen_batch, *(b for b, _ in profile.memory_points)]) * 1.25
    xs = [top * i / 100 for i in range(101)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(
        xs, [profile.memory_fit.predict_bytes(b) / GIB for b in xs], label=f"{profile.memory_fit.kind} fit"
    )
    ax.scatter(
        [b for b, _ in profile.memory_points],
        [v / GIB for _, v in profile.memory_points],
        color="black",
        zorder=3,
        label=f"{profile.method} points",
    )
    ax.axhline(
        budget_bytes / GIB, color="#dd8452", linestyle="--", label=f"budget {budget_bytes / GIB:.1f} GiB"
    )
    ax.axhline(total_bytes / GIB, color="grey", linestyle=":", label=f"total {total_bytes / GIB:.1f} GiB")
    ax.axvline(chosen_batch, color="#55a868", label=f"chosen batch {chosen_batch}")
    ax.set_xlabel("batch")
    ax.set_ylabel("GiB")
    ax.set_title(
        f"{model + ' on ' if model else ''}{profile.gpu}: memory per step ({profile.amp}, {profile.method}d)"
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # outside the curve
    path_out = _save(fig, path)
    plt.close(fig)
    return path_out


def _nice_ticks(ax, xs: list[float], ys: list[float], plt) -> None:
    """Ticks at 1-2-5 steps with plain labels (minutes; dollars) over the front's range: a log axis over less
    than a decade otherwise shows one label or none."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    def steps(values: list[float]) -> list[float]:
        positive = [v for v in values if v > 0]
        if not positive:
            return []
        low, high = min(positive) / 1.5, max(positive) * 1.5
        return [
            m * 10.0**e
            for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
            for m in (1, 2, 5)
            if low <= m * 10.0**e <= high
        ]

    for axis, values, unit in ((ax.xaxis, xs, ""), (ax.yaxis, ys, "$")):
        ticks = steps(values)
        if ticks:
            axis.set_major_locator(FixedLocator(ticks))
            axis.set_minor_locator(NullLocator())
            axis.set_major_formatter(FuncFormatter(lambda v, _pos, unit=unit: f"{unit}{v:g}"))


def plot_advice(result, front: list[dict[str, Any]], path: str) -> Path:
    """``batchplan advise --plot``: cost per epoch against time per epoch of every candidate planned (a
    ``planner.advise.search.SearchResult``), the front's points (``front``, as ``--json`` gives them) labelled
    with their step-time range, the dominated ones faint."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    on_front = {id(p) for p in result.front}
    others = [p for p in result.evaluated if id(p) not in on_front]
    ax.scatter(
        [p.time_per_epoch_s / 60 for p in others],
        [p.cost_per_epoch_usd for p in others],
        s=10,
        color="#4c72b0",
        alpha=0.15,
        label=f"planned, dominated ({len(others)})",
    )
    xs = [p["time_per_epoch_s"] / 60 for p in front]
    ys = [p["cost_per_epoch_usd"] for p in front]
    ax.step(xs, ys, where="post", color="#dd8452", linewidth=1, alpha=0.6)
    for index, (point, x, y) in enumerate(zip(front, xs, ys, strict=True)):
        low, high = (t / 60 for t in point["time_per_epoch_range_s"])
        ax.errorbar([x], [y], xerr=[[x - low], [high - x]], fmt="o", color="#dd8452", capsize=3)
        # neighbours on a front sit close: their labels alternate above and below the point
        ax.annotate(
            f"#{point['rank']} {point['cluster']}",
            (x, y),
            textcoords="offset points",
            xytext=(6, 5 if index % 2 == 0 else -12),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.01)
    _nice_ticks(ax, xs, ys, plt)
    ax.margins(x=0.2, y=0.1)
    ax.set_xlabel("time per epoch (min, log; bars: step-time model ±1σ)")
    ax.set_ylabel("cost per epoch (USD)")
    ax.set_title(
        f"batchplan advise: {len(front)} front points of {result.planned} planned, {result.candidates} candidates"
    )
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    return _save(fig, path)
