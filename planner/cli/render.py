"""Text rendering of plans (shared by ``plan``, ``show`` and ``preflight``)."""

from __future__ import annotations

from typing import Literal, get_args

from planner.cli.output import echo, format_gib, format_ms, print_json, print_table
from planner.codec import encode
from planner.plan.comm import comm_summary
from planner.plan.types import Plan

#: how ``plan`` and ``show`` print a plan: the table, or per-node environment lines (``--emit``)
EmitForm = Literal["table", "env", "slurm"]
EMIT_FORMS: tuple[str, ...] = get_args(EmitForm)


def render_plan(plan: Plan) -> None:
    """A plan as a person reads it: the job, one table row per rank, the step's figures, the launch lines, and
    what was excluded, noted or warned about."""
    job = plan.job
    echo(
        f"plan for {job.model} ({plan.mode}, optimizer {job.optimizer}, amp {job.amp}, "
        f"fraction {job.fraction}): {plan.world_size} ranks on {len(plan.nodes)} node(s)"
    )
    _print_rank_table(plan)
    echo(
        f"global batch {plan.global_batch} = {plan.step_batch} per step × accumulate {plan.accumulate}; "
        f"step {format_ms(plan.predicted_step_time_s)} ms; {plan.throughput_samples_per_s:.0f} samples/s; "
        f"balance efficiency {plan.balance_efficiency:.2f}" + _expected_range(plan)
    )
    sync_line = comm_summary(plan)
    if sync_line:
        echo(sync_line)
    if plan.alternatives:
        echo(
            "throughput by mode (samples/s): "
            + ", ".join(f"{k} {v:.0f}" for k, v in plan.alternatives.items())
        )
    echo()
    echo("launch (one line per node):")
    for node in plan.nodes:
        echo(f"  [{node.name}] {node.torchrun}")
    _print_excluded_and_notes(plan)


def _print_rank_table(plan: Plan) -> None:
    """One row per rank: where it runs, its GPU type, batch and cap, memory, step time, idle share, loss weight."""
    # the columns after the device's repeat across the ranks of a GPU type at one batch: each shared tail is
    # formatted once (a 65,536-rank plan has a handful)
    tails: dict[tuple, list[str]] = {}

    def tail(r) -> list[str]:
        key = (
            r.gpu,
            r.batch,
            r.max_batch,
            r.predicted_memory_bytes,
            r.memory_budget_bytes,
            r.total_memory_bytes,
            r.predicted_step_time_s,
            r.idle_fraction,
            r.loss_weight,
        )
        if key not in tails:
            memory = "/".join(format_gib(b) for b in key[3:6])
            tails[key] = [
                r.gpu,
                str(r.batch),
                str(r.max_batch),
                memory,
                format_ms(r.predicted_step_time_s),
                f"{(r.idle_fraction or 0.0) * 100:.0f}%",
                f"{r.loss_weight:.4f}",
            ]
        return tails[key]

    rows = [[str(r.rank), r.node, str(r.local_rank), str(r.device_index), *tail(r)] for r in plan.ranks]
    print_table(
        None,
        [
            "rank",
            "node",
            "local",
            "gpu#",
            "type",
            "batch",
            "cap",
            "mem GiB pred/budget/total",
            "step ms",
            "idle",
            "loss w",
        ],
        rows,
    )


def _print_excluded_and_notes(plan: Plan) -> None:
    """The GPUs the plan left out and why, then its notes and warnings, each list under its title."""
    if plan.excluded:
        echo()
        echo("excluded:")
        for e in plan.excluded:
            where = e.node if e.device_index is None else f"{e.node} GPU {e.device_index} ({e.gpu})"
            echo(f"  {where}: {e.reason}")
    for title, lines in (("notes", plan.notes), ("warnings", plan.warnings)):
        if lines:
            echo()
            echo(f"{title}:")
            for line in lines:
                echo(f"  - {line}")


def print_plan(
    plan: Plan, *, as_json: bool, emit: EmitForm, node: str | None = None, node_rank: int | None = None
) -> None:
    """A plan on stdout in the form asked for: exact JSON, one node's environment (``--emit env``, the node
    chosen by name or node rank; see ``planner.cli.emit_env``), the ``srun`` line of a SLURM job (``--emit
    slurm``: ``planner.plan.slurm_launch``), or the table."""
    if as_json:
        print_json(encode(plan))
    elif emit == "env":
        from planner.cli.emit_env import env_lines, selected_node_rank

        for line in env_lines(plan, selected_node_rank(plan, node, node_rank)):
            echo(line)
    elif emit == "slurm":
        from planner.plan.slurm_launch import srun_line

        echo(srun_line(plan))
    else:
        render_plan(plan)


def _expected_range(plan: Plan) -> str:
    """`` (0.91-0.99 expected at real speed)`` when the plan states a range wider than its point figure, as
    printed (one GPU type's error moves every rank alike: "0.95 (0.95-0.95 expected ...)" said nothing)."""
    span = plan.balance_efficiency_range
    if not span or f"{span[0]:.2f}" == f"{span[1]:.2f}":
        return ""
    return f" ({span[0]:.2f}-{span[1]:.2f} expected at real speed, step-time model ±1σ per GPU type)"
