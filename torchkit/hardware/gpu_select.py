"""The choice of idle GPUs from their stats: pure and cheap (no NVML, no torch).

A pure layer on ``torchkit.hardware.nvml.GpuStats`` that the planner reuses for simulated nodes: ``select_gpus``
(thresholds, ``all`` / ``-1,-1`` / ``0,2`` specs, a reason for every GPU left out) and ``rank_idle_gpus``
(the seed's idle order, used by ``GPUInfo.select_idle_gpu`` and ``torchkit.seed_api.device``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torchkit.errors import ConfigError
from torchkit.hardware.nvml import GpuStats
from torchkit.units import GIB

# a relative tolerance for fraction comparisons: 80% utilisation leaves 20% free, and 1 - 0.8 < 0.2 in floats
_EPS = 1e-9

# ------------------------------------------------------------------------------------------------ seed ranking


def check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a fraction in [0, 1], got {value!r} (e.g. 0.2 for 20%)")


def rank_idle_gpus(
    stats: Sequence[GpuStats],
    count: int,
    *,
    min_memory_fraction: float = 0.0,
    min_util_fraction: float = 0.0,
    indices: Iterable[int] | None = None,
    tie_break: Callable[[], float] = random.random,
) -> list[int]:
    """The seed's idle choice, pure: up to ``count`` GPU indices, most idle first.

    Eligible: index in ``indices`` (when given), free/total memory >= ``min_memory_fraction`` and free
    utilisation (1 - utilisation) >= ``min_util_fraction``. Order: utilisation ascending, then free memory
    descending, then ``tie_break()`` (random by default, so jobs launched together spread out). A GPU with
    unknown utilisation ranks after every GPU whose utilisation is known, and is eligible only when
    ``min_util_fraction`` is 0.
    """
    allowed = None if indices is None else set(indices)
    eligible = [
        s
        for s in stats
        if (allowed is None or s.index in allowed)
        and s.memory_free_fraction >= min_memory_fraction - _EPS
        and (
            min_util_fraction <= 0.0
            if s.utilization_fraction is None
            else 1.0 - s.utilization_fraction >= min_util_fraction - _EPS
        )
    ]
    eligible.sort(
        key=lambda s: (
            s.utilization_fraction is None,
            s.utilization_fraction or 0.0,
            -s.memory_free_bytes,
            tie_break(),
        )
    )
    return [s.index for s in eligible[: max(0, count)]]


# ------------------------------------------------------------------------------------------------ planner layer


@dataclass(frozen=True, kw_only=True)
class SelectSpec:
    """A parsed GPU selection: ``all``, or explicit indices plus a number of idle picks (``0,-1,-1``)."""

    text: str
    """the spec as given, normalised (lower case, no spaces)"""
    select_all: bool = False
    """``all``: every GPU meeting the thresholds"""
    explicit_indices: tuple[int, ...] = ()
    """indices named in the spec, in order"""
    idle_count: int = 0
    """number of ``-1`` tokens: that many most-idle GPUs among the rest"""


_SPEC_HELP = "use 'all', '-1' for the most idle GPU, '-1,-1' for the two most idle, or indices like '0,2'"


def parse_select_spec(spec: str) -> SelectSpec:
    """Parse a GPU selection (``all``, ``-1,-1``, ``0,2``, ``0,-1``).

    Raises:
        ConfigError: empty spec, a token that is neither an index nor -1, or an index named twice.
    """
    text = str(spec).strip().lower().replace(" ", "")
    if text == "all":
        return SelectSpec(text=text, select_all=True)
    if not text:
        raise ConfigError(f"empty GPU selection ({_SPEC_HELP})")
    explicit: list[int] = []
    idle_count = 0
    for token in text.split(","):
        if token == "-1":
            idle_count += 1
        elif token.isdigit():
            index = int(token)
            if index in explicit:
                raise ConfigError(f"GPU selection {spec!r} names GPU {index} twice ({_SPEC_HELP})")
            explicit.append(index)
        else:
            raise ConfigError(f"GPU selection {spec!r}: {token!r} is not a GPU index or -1 ({_SPEC_HELP})")
    return SelectSpec(text=text, explicit_indices=tuple(explicit), idle_count=idle_count)


@dataclass(frozen=True, kw_only=True)
class GpuSelection:
    """The GPUs a node will use and why the others are left out."""

    selected: tuple[int, ...]
    """chosen GPU indices: explicit ones in the order given, then idle picks most idle first (``all``:
    ascending)"""
    skipped: tuple[tuple[int, str], ...]
    """(index, reason) for every GPU not selected, ascending by index"""
    busy: tuple[int, ...] = ()
    """the skipped GPUs that were left out for breaching an idle threshold (the others were idle enough, only
    not asked for or not picked): what a go/no-go check reads instead of the reasons' wording"""
    warnings: tuple[str, ...] = ()
    """explicitly requested GPUs that are used although they breach a threshold"""


class InsufficientGpusError(ConfigError):
    """Fewer GPUs meet the thresholds than the selection asks for.

    ``eligible``: the GPUs that could be picked; ``skipped``: (index, reason) for each GPU that breaches a
    threshold (GPUs named explicitly in the spec are in neither)."""

    def __init__(
        self, message: str, *, requested: int, eligible: tuple[int, ...], skipped: tuple[tuple[int, str], ...]
    ):
        super().__init__(message)
        self.requested = requested
        """number of idle GPUs asked for"""
        self.eligible = eligible
        """indices that met the thresholds (and were not named explicitly)"""
        self.skipped = skipped
        """(index, reason) for every GPU that breaches a threshold"""


def threshold_breaches(
    stats: GpuStats, *, min_free_memory_fraction: float = 0.0, max_utilization_fraction: float = 1.0
) -> list[str]:
    """Why a GPU fails the thresholds (empty when it meets them), e.g. ``busy: 85% utilisation > 50%``."""
    reasons: list[str] = []
    if stats.utilization_fraction is None:
        if max_utilization_fraction < 1.0:
            reasons.append(f"utilisation unknown (limit {max_utilization_fraction:.0%})")
    elif stats.utilization_fraction > max_utilization_fraction + _EPS:
        reasons.append(f"busy: {stats.utilization_fraction:.0%} utilisation > {max_utilization_fraction:.0%}")
    if min_free_memory_fraction > 0.0 and stats.memory_free_fraction < min_free_memory_fraction - _EPS:
        reasons.append(
            f"only {stats.memory_free_bytes / GIB:.1f} GiB of {stats.memory_total_bytes / GIB:.1f} GiB free "
            f"(< {min_free_memory_fraction:.0%})"
        )
    return reasons


def _idle_order(stats: GpuStats) -> tuple[bool, int, float, int]:
    # most free memory first (the planner's budget is memory), then lowest utilisation; unknown utilisation
    # ranks after every known one; the index makes the order deterministic
    return (
        stats.utilization_fraction is None,
        -stats.memory_free_bytes,
        stats.utilization_fraction or 0.0,
        stats.index,
    )


def select_gpus(
    stats: Sequence[GpuStats],
    spec: str = "all",
    *,
    min_free_memory_fraction: float = 0.0,
    max_utilization_fraction: float = 1.0,
) -> GpuSelection:
    """Choose a node's GPUs from their stats. Pure and deterministic (no NVML, no randomness).

    Specs:
      * ``all``: every GPU that meets the thresholds (none meeting them is a valid, empty answer);
      * ``-1`` repeated (``-1,-1``): that many most-idle GPUs meeting the thresholds: most free memory
        first, then lowest utilisation; a GPU with unknown utilisation ranks last;
      * indices (``0,2``): those GPUs, as given. A named GPU that breaches a threshold is still used (the
        user asked for it by name) and the breach is reported in ``warnings``;
      * a mix (``0,-1``): the named GPUs plus that many idle ones among the others.

    Thresholds: free memory / total >= ``min_free_memory_fraction`` and utilisation <=
    ``max_utilization_fraction``; an unknown utilisation fails a limit below 1.

    Raises:
        ConfigError: malformed spec, a fraction outside [0, 1], or a named index the node does not have.
        InsufficientGpusError (a ConfigError): fewer eligible GPUs than ``-1`` tokens; the message names what
            was asked, what is available and why each other GPU was left out.
    """
    check_fraction("min_free_memory_fraction", min_free_memory_fraction)
    check_fraction("max_utilization_fraction", max_utilization_fraction)
    request = parse_select_spec(spec)
    breaches = _checked_breaches(stats, request, spec, min_free_memory_fraction, max_utilization_fraction)

    selected = list(request.explicit_indices)
    warnings = [
        f"GPU {i} is used as requested although it does not meet the thresholds: {'; '.join(breaches[i])}"
        for i in request.explicit_indices
        if breaches[i]
    ]
    if request.select_all:
        selected = [s.index for s in sorted(stats, key=lambda s: s.index) if not breaches[s.index]]
    elif request.idle_count:
        candidates = sorted(
            (s for s in stats if not breaches[s.index] and s.index not in request.explicit_indices),
            key=_idle_order,
        )
        if len(candidates) < request.idle_count:
            skipped = tuple(
                (s.index, "; ".join(breaches[s.index]))
                for s in sorted(stats, key=lambda s: s.index)
                if breaches[s.index] and s.index not in request.explicit_indices
            )
            raise InsufficientGpusError(
                _shortfall_message(
                    spec,
                    request,
                    stats,
                    candidates,
                    skipped,
                    min_free_memory_fraction,
                    max_utilization_fraction,
                ),
                requested=request.idle_count,
                eligible=tuple(s.index for s in candidates),
                skipped=skipped,
            )
        selected += [s.index for s in candidates[: request.idle_count]]

    return _selection(stats, request, selected, breaches, warnings)


def _checked_breaches(
    stats: Sequence[GpuStats],
    request: SelectSpec,
    spec: str,
    min_free_memory_fraction: float,
    max_utilization_fraction: float,
) -> dict[int, list[str]]:
    """Each GPU's threshold breaches, after checking that the indices are unique and every named one exists."""
    by_index = {s.index: s for s in stats}
    if len(by_index) != len(stats):
        raise ValueError(f"GPU indices are not unique: {[s.index for s in stats]}")
    missing = [i for i in request.explicit_indices if i not in by_index]
    if missing:
        have = ", ".join(str(i) for i in sorted(by_index)) or "none"
        raise ConfigError(
            f"GPU selection {spec!r} names GPU {missing[0]}, but this node's GPUs are: {have} "
            "(use indices listed by 'batchplan devices')"
        )
    return {
        s.index: threshold_breaches(
            s,
            min_free_memory_fraction=min_free_memory_fraction,
            max_utilization_fraction=max_utilization_fraction,
        )
        for s in stats
    }


def _selection(
    stats: Sequence[GpuStats],
    request: SelectSpec,
    selected: list[int],
    breaches: dict[int, list[str]],
    warnings: list[str],
) -> GpuSelection:
    """``selected`` with every other GPU skipped and its reason."""
    chosen = set(selected)
    skipped_list: list[tuple[int, str]] = []
    busy: list[int] = []
    for s in sorted(stats, key=lambda s: s.index):
        if s.index in chosen:
            continue
        if not request.select_all and not request.idle_count:
            reason = "not requested"
        elif breaches[s.index]:
            reason = "; ".join(breaches[s.index])
            busy.append(s.index)
        else:
            reason = "less idle than the GPUs picked"
        skipped_list.append((s.index, reason))
    return GpuSelection(
        selected=tuple(selected), skipped=tuple(skipped_list), busy=tuple(busy), warnings=tuple(warnings)
    )


def _shortfall_message(
    spec: str,
    request: SelectSpec,
    stats: Sequence[GpuStats],
    candidates: Sequence[GpuStats],
    skipped: Sequence[tuple[int, str]],
    min_free_memory_fraction: float,
    max_utilization_fraction: float,
) -> str:
    asked = f"{request.idle_count} idle GPU{'s' if request.idle_count != 1 else ''}"
    if not stats:
        return f"GPU selection {spec!r} asks for {asked}, but this node has no GPUs"
    available = ", ".join(str(s.index) for s in candidates) or "none"
    explicit = (
        f" besides the named GPU(s) {', '.join(str(i) for i in request.explicit_indices)}"
        if request.explicit_indices
        else ""
    )
    reasons = "".join(f"; GPU {i}: {reason}" for i, reason in skipped)
    return (
        f"GPU selection {spec!r} asks for {asked}{explicit}, but only {len(candidates)} of the node's "
        f"{len(stats)} GPUs can be picked ({available}) with free memory >= {min_free_memory_fraction:.0%} and "
        f"utilisation <= {max_utilization_fraction:.0%}{reasons} (ask for fewer GPUs or relax the thresholds)"
    )


def select_gpus_or_none(
    stats: Sequence[GpuStats],
    spec: str = "all",
    *,
    min_free_memory_fraction: float = 0.0,
    max_utilization_fraction: float = 1.0,
) -> GpuSelection:
    """``select_gpus`` for one node of many: a selection the node cannot meet is not an error but an empty
    selection, every GPU skipped with its reason, and the error's message as a warning.

    Raises:
        ConfigError: a malformed spec or thresholds, or an index the node does not have.
    """
    try:
        return select_gpus(
            stats,
            spec,
            min_free_memory_fraction=min_free_memory_fraction,
            max_utilization_fraction=max_utilization_fraction,
        )
    except InsufficientGpusError as exc:
        reasons = dict(exc.skipped)
        return GpuSelection(
            selected=(),
            skipped=tuple(
                (g.index, reasons.get(g.index, f"not used: selection {spec!r} cannot be met"))
                for g in sorted(stats, key=lambda g: g.index)
            ),
            busy=tuple(index for index, _ in exc.skipped),
            warnings=(str(exc),),
        )
