"""GPUs that other processes already use: what the plan expects of them, and the one line that says so.

Policy (the defaults an operator expects of a shared machine; flags in ``JobSpec``):

- **skip** a GPU with less than ``min_free_memory_fraction`` of its memory free (default 20%, the seed's
  idle criterion: Ultralytics' ``select_device`` picks idle GPUs with ``min_memory_fraction=0.2``) or busier
  than ``max_utilization_fraction`` (default 50%: past that, time slicing leaves our job at most half the GPU
  and every DDP step waits for it). The probe's GPU selection applies these thresholds; the reason lands in
  ``excluded``.
- **derate** the GPUs kept: other processes' work takes a share of the GPU's time, so a rank there runs at
  ``speed_factor = 1 - utilisation`` of the profiled speed (its step time is divided by it; never below
  ``MIN_SPEED_FACTOR``), and its memory budget is a fraction of what is *free*, so held memory lowers it.

NVML utilisation is the share of time a kernel ran in the last sample period, a coarse figure: the derating
is a first-order model (Known limitations: contention for memory bandwidth and the time-slice scheduler's
own overhead are not modelled; an unknown utilisation, e.g. on MIG, is taken as idle).

Pure: no torch, no Ray, no NVML.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchkit.hardware.nvml import GpuStats
from torchkit.units import GIB

#: a GPU that other work keeps (nearly) always busy still gets some time slices; below this the model's
#: "our share" is noise, and dividing by it would make one rank's predicted time absurd
MIN_SPEED_FACTOR = 0.05


def speed_factor(stats: GpuStats) -> float:
    """The share of the GPU's speed a new job gets next to the work already on it: ``1 - utilisation``."""
    if stats.utilization_fraction is None:
        return 1.0
    return max(MIN_SPEED_FACTOR, 1.0 - float(stats.utilization_fraction))


def _load(stats: GpuStats) -> str:
    parts = []
    if stats.utilization_fraction:
        parts.append(f"{stats.utilization_fraction:.0%} busy")
    if stats.memory_used_bytes > 0:
        parts.append(f"{stats.memory_used_bytes / GIB:.1f} of {stats.memory_total_bytes / GIB:.1f} GiB held")
    return ", ".join(parts)


def is_shared(stats: GpuStats) -> bool:
    """Another process holds memory on it or keeps it busy."""
    return bool(stats.utilization_fraction) or stats.memory_used_bytes > 0


def busy_summary(
    skipped: Sequence[tuple[str, GpuStats, str]],
    derated: Sequence[tuple[str, GpuStats, int]],
    *,
    min_free_memory_fraction: float,
    max_utilization_fraction: float,
) -> str | None:
    """One line on what the policy did with shared GPUs, or None when no GPU is shared. The settings are named
    in backticks (``planner.errors.render_fields``).

    Args:
        skipped: ``(node, stats, reason)`` of shared GPUs left out by the idle thresholds.
        derated: ``(node, stats, memory budget bytes)`` of shared GPUs planned at reduced speed.
    """
    if not skipped and not derated:
        return None
    said = []
    if skipped:
        said.append("skipped " + "; ".join(f"{node} GPU {s.index} ({_load(s)})" for node, s, _ in skipped))
    if derated:
        said.append(
            "planned at reduced speed "
            + "; ".join(
                f"{node} GPU {s.index} at {speed_factor(s):.0%} speed ({_load(s)}; budget {budget / GIB:.1f} GiB)"
                for node, s, budget in derated
            )
        )
    return (
        f"shared GPUs: {'; '.join(said)} (policy: skip below {min_free_memory_fraction:.0%} free memory or "
        f"above {max_utilization_fraction:.0%} utilisation, else plan at 1 - utilisation of the speed; "
        "`min_free_memory_fraction`, `max_utilization_fraction`)"
    )
