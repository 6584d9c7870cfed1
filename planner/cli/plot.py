"""Pictures of a plan and of a profile (``--plot FILE.png``; needs the ``plot`` extra, matplotlib)."""

from __future__ import annotations

from pathlib import Path

from planner.errors import ConfigError
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
        raise ConfigError(f"cannot write the picture to {target}: {exc.strerror or exc} (choose another --plot path)") from exc
    return target


def plot_plan(plan: dict, path: str) -> Path:
    """Per rank: batch (and cap), memory predicted vs budget vs total, predicted step time."""
    plt = _pyplot()
    ranks = plan["ranks"]
    labels = [f"{r['rank']}\n{r['gpu']}" for r in ranks]
    x = range(len(ranks))
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, 0.6 * len(ranks) + 2), 9), sharex=True)
    axes[0].bar(x, [r["max_batch"] for r in ranks], color="#d9d9d9", label="cap (max batch)")
    axes[0].bar(x, [r["batch"] for r in ranks], color="#4c72b0", label="planned batch")
    axes[0].set_ylabel("samples / step")
    axes[0].legend(loc="upper right")
    axes[0].set_title(
        f"{plan['job']['model']}: global batch {plan['global_batch']}, "
        f"{plan['throughput_samples_per_s']:.0f} samples/s, balance {plan['balance_efficiency']:.2f}"
    )
    axes[1].bar(x, [r["total_memory_bytes"] / GIB for r in ranks], color="#eeeeee", label="total")
    axes[1].bar(x, [r["memory_budget_bytes"] / GIB for r in ranks], color="#c6dbef", label="budget")
    axes[1].bar(x, [r["predicted_memory_bytes"] / GIB for r in ranks], color="#dd8452", width=0.5, label="predicted")
    axes[1].set_ylabel("GiB")
    axes[1].legend(loc="upper right")
    axes[2].bar(x, [r["predicted_step_time_s"] * 1000 for r in ranks], color="#55a868")
    axes[2].axhline(plan["predicted_step_time_s"] * 1000, color="black", linestyle="--", linewidth=1,
                    label="step time (slowest rank)")
    axes[2].set_ylabel("step ms")
    axes[2].legend(loc="upper right")
    axes[2].set_xticks(list(x))
    axes[2].set_xticklabels(labels, fontsize=8)
    fig.tight_layout()
    path_out = _save(fig, path)
    plt.close(fig)
    return path_out


def plot_profile(profile_json: dict, *, budget_bytes: int, total_bytes: int, chosen_batch: int, path: str) -> Path:
    """The memory curve with its probe points, the budget line and the chosen batch."""
    from planner.profiles.profile import DeviceProfile

    plt = _pyplot()
    profile = DeviceProfile.from_json(profile_json)
    top = max([chosen_batch, *(b for b, _ in profile.memory_points)]) * 1.25
    xs = [top * i / 100 for i in range(101)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [profile.memory_fit.predict_bytes(b) / GIB for b in xs], label=f"{profile.memory_fit.kind} fit")
    ax.scatter([b for b, _ in profile.memory_points], [v / GIB for _, v in profile.memory_points],
               color="black", zorder=3, label=f"{profile.method} points")
    ax.axhline(budget_bytes / GIB, color="#dd8452", linestyle="--", label="budget")
    ax.axhline(total_bytes / GIB, color="grey", linestyle=":", label="total")
    ax.axvline(chosen_batch, color="#55a868", label=f"chosen batch {chosen_batch}")
    ax.set_xlabel("batch")
    ax.set_ylabel("GiB")
    ax.set_title(f"{profile.gpu} ({profile.amp})")
    ax.legend()
    path_out = _save(fig, path)
    plt.close(fig)
    return path_out
