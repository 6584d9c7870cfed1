"""Pre-flight checks a scheduler runs before submitting a job: go (all ok) or no-go with reasons.

Pure functions over what the driver found (inventories, failed nodes) and the plan (or why there is none).
Each check has a name, ok and a one-line detail; ``batchplan preflight`` turns them into exit 0 / 1. The
checks decide on typed fields and enums (``GpuSelection.busy``, ``ExclusionKind``, ``AdviceKind``), never on
the wording of a reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.allocate.advice import AdviceKind
from planner.codec import NOT_WRITTEN, OMIT_DEFAULT
from planner.errors import FieldError, field_name
from planner.plan.types import ExclusionKind, Plan
from planner.probing.inventory import NodeInventory

SCHEMA = "batchplan/preflight@1"


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    ok: bool
    detail: str
    warning: bool = field(default=False, metadata=NOT_WRITTEN)
    """ok, but worth a look (printed as ``warn``; in JSON the detail starts with ``warning:``)"""

    fix: str = field(default="", metadata=OMIT_DEFAULT)
    """for a failed check: what to change so that it passes (in JSON as ``fix`` when there is one)"""


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """What counts as go. Checked here, whoever builds it (``FieldError`` names the field; the CLI shows its flag)."""

    max_imbalance: float = 0.15
    """largest share of a step any rank may sit idle waiting for the slowest (1 − t_i/t_step)"""
    expect_nodes: int | None = None
    """nodes that must answer (default: every node of a cluster config; any number on a real cluster)"""
    expect_gpus: int | None = None
    """ranks the plan must have at least"""
    min_subset_gain: float = 1.10
    """fail when dropping some GPU types would be at least this many times faster"""

    def __post_init__(self) -> None:
        def number(value: object) -> bool:
            return isinstance(value, int | float) and not isinstance(value, bool)

        if not number(self.max_imbalance) or not 0 <= self.max_imbalance <= 1:
            raise FieldError(
                "max_imbalance", f"`max_imbalance` {self.max_imbalance} is invalid (use a share in [0, 1])"
            )
        for name in ("expect_nodes", "expect_gpus"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise FieldError(name, f"`{name}` {value} is invalid (use an integer >= 1)")
        if not number(self.min_subset_gain) or not self.min_subset_gain >= 1:
            raise FieldError(
                "min_subset_gain",
                f"`min_subset_gain` {self.min_subset_gain} is invalid (use a ratio >= 1, e.g. 1.1)",
            )


def _versions_check(inventories: Sequence[NodeInventory]) -> Check:
    real = [inv for inv in inventories if not inv.simulated and inv.driver]
    if not real:
        return Check(
            name="versions_consistent", ok=True, detail="simulated nodes: no driver versions to compare"
        )
    fields = ("driver_version", "cuda_driver_version", "torch_version", "torch_cuda_version")
    differing = []
    for name in fields:
        values = {inv.name: (inv.driver or {}).get(name) for inv in real}
        if len(set(values.values())) > 1:
            differing.append(f"{name}: " + ", ".join(f"{n}={v}" for n, v in sorted(values.items())))
    if differing:
        return Check(name="versions_consistent", ok=False, detail="; ".join(differing))
    first = real[0].driver or {}
    return Check(
        name="versions_consistent",
        ok=True,
        detail=", ".join(f"{f} {first.get(f)}" for f in fields if first.get(f))
        + f" on all {len(real)} nodes",
    )


def _node_checks(
    inventories: Sequence[NodeInventory],
    failed_nodes: dict[str, str],
    expected_node_names: Sequence[str],
    plan: Plan | None,
    thresholds: Thresholds,
) -> list[Check]:
    """Did the cluster answer, every expected node, with the GPUs asked for, idle enough?"""
    answered = {inv.name for inv in inventories}
    checks = [Check(name="cluster_reachable", ok=True, detail=f"{len(answered)} node(s) answered")]
    missing = [n for n in expected_node_names if n not in answered or n in failed_nodes]
    missing += [n for n in failed_nodes if n not in missing]
    expected = thresholds.expect_nodes if thresholds.expect_nodes is not None else len(expected_node_names)
    present = len(answered - set(failed_nodes))
    detail = f"{present} of {expected or present} node(s) probed"
    if missing:
        detail += "; missing: " + "; ".join(f"{n} ({failed_nodes.get(n, 'did not answer')})" for n in missing)
    checks.append(Check(name="nodes_present", ok=not missing and present >= expected, detail=detail))

    selected = sum(len(inv.selection.selected) for inv in inventories)
    total = sum(len(inv.devices) for inv in inventories)
    ranks = plan.world_size if plan is not None else 0
    want = thresholds.expect_gpus
    checks.append(
        Check(
            name="gpus_present",
            ok=selected > 0 and (want is None or ranks >= want),
            detail=f"{selected} of {total} GPU(s) selected, {ranks} planned as ranks"
            + (f", {want} required" if want is not None else ""),
        )
    )
    # with --gpus -1,-1 (pick N idle GPUs) a busy GPU the pick left out was never requested: only a node that
    # got fewer than N fails on its busy GPUs
    auto_count = _auto_pick_count(plan.job.gpus) if plan is not None else None
    busy = [
        f"{inv.name} GPU {index}: {reason}"
        for inv in inventories
        if auto_count is None or len(inv.selection.selected) < auto_count
        for index, reason in inv.selection.skipped
        if index in inv.selection.busy
    ]
    checks.append(
        Check(
            name="idle_thresholds",
            ok=not busy,
            detail="every requested GPU meets the idle thresholds" if not busy else "; ".join(busy),
        )
    )
    return checks


def _auto_pick_count(gpus: str) -> int | None:
    """N for a selection of N most idle GPUs (``-1,-1``), None for ``all`` or explicit indices."""
    parts = [p.strip() for p in gpus.split(",")]
    return len(parts) if parts and all(p == "-1" for p in parts) else None


def _plan_checks(plan: Plan, thresholds: Thresholds, name_of: Callable[[str], str]) -> list[Check]:
    """Is the plan complete (every rank fits, the global batch is reached), balanced, worth every GPU?"""
    checks = [
        Check(
            name="plan_feasible",
            ok=True,
            detail=f"{plan.world_size} ranks, global batch {plan.global_batch} (accumulate {plan.accumulate})",
        )
    ]
    too_small = [e for e in plan.excluded if e.kind is ExclusionKind.BELOW_MIN_BATCH]
    checks.append(
        Check(
            name="min_batch_fits",
            ok=not too_small,
            detail="every rank fits the minimum batch"
            if not too_small
            else "; ".join(f"{e.node} GPU {e.device_index} ({e.gpu}): {e.reason}" for e in too_small),
        )
    )
    if plan.job.global_batch is not None:
        checks.append(
            Check(
                name="global_batch_reachable",
                ok=plan.global_batch == plan.job.global_batch,
                detail=f"{plan.global_batch} = {plan.step_batch} × {plan.accumulate}",
            )
        )
    worst = max(plan.ranks, key=lambda r: r.idle_fraction or 0.0, default=None)
    imbalance = (worst.idle_fraction or 0.0) if worst is not None else 0.0
    checks.append(
        Check(
            name="imbalance",
            ok=imbalance <= thresholds.max_imbalance,
            detail=f"largest idle share {imbalance:.1%}"
            + (f" (rank {worst.rank}, {worst.gpu})" if worst and imbalance > 0 else "")
            + f"; limit {thresholds.max_imbalance:.0%} ({name_of('max_imbalance')})",
        )
    )
    checks.append(_subset_check(plan, thresholds))
    return checks


def _subset_check(plan: Plan, thresholds: Thresholds) -> Check:
    """Would dropping some GPU types be faster by at least ``min_subset_gain``?"""
    alternatives = plan.alternatives or {}
    best_name, best = max(
        ((k, v) for k, v in alternatives.items() if k in ("best_group_subset", "best_single_group")),
        key=lambda kv: kv[1],
        default=(None, 0.0),
    )
    current = plan.throughput_samples_per_s
    gain = best / current if current > 0 and best_name else 0.0
    advice = [a for a in plan.advice if a.kind in (AdviceKind.DROP_GROUPS, AdviceKind.SINGLE_GROUP)]
    if gain >= thresholds.min_subset_gain:
        detail = advice[0] if advice else f"{best_name} would be {gain:.2f}× faster"
    else:
        detail = "every GPU type adds throughput" if best_name else "one GPU type: nothing to drop"
    return Check(name="slow_gpus_worth_it", ok=gain < thresholds.min_subset_gain, detail=str(detail))


def _shared_gpus_check(plan: Plan | None) -> Check | None:
    """A warning (ok, detail ``warning: ...``), not a failure, for ranks on GPUs other work keeps busy: the
    plan already expects less of them (``RankEntry.speed_factor``, planner.probing.busy)."""
    derated = [r for r in (plan.ranks if plan is not None else ()) if r.speed_factor < 1.0]
    if not derated:
        return None
    said = "; ".join(f"{r.node} GPU {r.device_index} at {r.speed_factor:.0%} speed" for r in derated)
    return Check(
        name="shared_gpus",
        ok=True,
        warning=True,
        detail=f"warning: shared GPUs: planned at reduced speed {said} (other work uses them; see the "
        "plan's warnings)",
    )


#: what to change when a check fails; ``{field}`` is a job or threshold field, named by ``name_of`` (the CLI:
#: its flag)
FIXES: dict[str, str] = {
    "nodes_present": "start or repair the missing nodes (`ray status` lists the live ones), or accept fewer with "
    "{expect_nodes}",
    "gpus_present": "relax {min_free_memory_fraction} / {max_utilization_fraction}, choose GPUs with {gpus}, or "
    "lower {expect_gpus}",
    "idle_thresholds": "free those GPUs, pick others with {gpus}, or relax {min_free_memory_fraction} / "
    "{max_utilization_fraction} (0 and 1 keep every GPU, derated)",
    "versions_consistent": "install the same NVIDIA driver, CUDA and torch on every node",
    "plan_feasible": "a smaller {global_batch} or {min_batch}, or a larger {fraction}, may fit; the detail says why",
    "min_batch_fits": "lower {min_batch}, raise {fraction}, or leave those GPUs out with {gpus}",
    "global_batch_reachable": "ask for a global batch the plan reaches ({global_batch} = step batch × accumulate)",
    "imbalance": "raise {max_imbalance}, plan with {mode} balanced, or leave the slow GPUs out with {gpus}",
    "slow_gpus_worth_it": "leave the slow GPU types out (their nodes, or {gpus} per node), or raise {min_subset_gain}",
}


def _with_fixes(checks: list[Check], name_of: Callable[[str], str]) -> list[Check]:
    """Every failed check with its fix (:data:`FIXES`), its fields named by ``name_of``."""
    import dataclasses
    import string

    out = []
    for check in checks:
        template = FIXES.get(check.name)
        if not check.ok and template and not check.fix:
            fields = {f: name_of(f) for _, f, _, _ in string.Formatter().parse(template) if f}
            check = dataclasses.replace(check, fix=template.format(**fields))
        out.append(check)
    return out


def run_checks(
    *,
    inventories: Sequence[NodeInventory],
    failed_nodes: dict[str, str],
    expected_node_names: Sequence[str],
    plan: Plan | None,
    plan_error: str | None,
    thresholds: Thresholds,
    name_of: Callable[[str], str] = field_name,
) -> list[Check]:
    """Every check, in the order ``batchplan preflight`` prints them; ``name_of`` names a threshold in a detail
    (the CLI: by its flag)."""
    checks = _node_checks(inventories, failed_nodes, expected_node_names, plan, thresholds)
    checks.append(_versions_check(inventories))
    shared = _shared_gpus_check(plan)
    if shared is not None:
        checks.append(shared)
    if plan is None:
        checks.append(Check(name="plan_feasible", ok=False, detail=plan_error or "no plan"))
        return _with_fixes(checks, name_of)
    return _with_fixes(checks + _plan_checks(plan, thresholds, name_of), name_of)
