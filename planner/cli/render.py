"""Text rendering of plans (shared by ``plan``, ``show`` and ``preflight``)."""

from __future__ import annotations

from planner.cli.output import echo, format_gib, print_json, print_table
from planner.plan.launch import DEFAULT_MASTER_PORT


def render_plan(plan: dict) -> None:
    job = plan["job"]
    echo(
        f"plan for {job['model']} ({plan['mode']}, optimizer {job['optimizer']}, amp {job['amp']}, "
        f"fraction {job['fraction']}): {plan['world_size']} ranks on {len(plan['nodes'])} node(s)"
    )
    rows = [
        [
            r["rank"], r["node"], r["local_rank"], r["device_index"], r["gpu"], r["batch"], r["max_batch"],
            f"{format_gib(r['predicted_memory_bytes'])}/{format_gib(r['memory_budget_bytes'])}/"
            f"{format_gib(r['total_memory_bytes'])}",
            f"{r['predicted_step_time_s'] * 1000:.0f}",
            f"{r.get('idle_fraction', 0.0) * 100:.0f}%",
            f"{r['loss_weight']:.4f}",
        ]
        for r in plan["ranks"]
    ]
    print_table(
        None,
        ["rank", "node", "local", "gpu#", "type", "batch", "cap", "mem GiB pred/budget/total", "step ms", "idle",
         "loss w"],
        rows,
    )
    echo(
        f"global batch {plan['global_batch']} = {plan['step_batch']} per step × accumulate {plan['accumulate']}; "
        f"step {plan['predicted_step_time_s'] * 1000:.0f} ms; {plan['throughput_samples_per_s']:.0f} samples/s; "
        f"balance efficiency {plan['balance_efficiency']:.2f}"
    )
    alternatives = plan.get("alternatives") or {}
    if alternatives:
        echo("throughput by mode (samples/s): " + ", ".join(f"{k} {v:.0f}" for k, v in alternatives.items()))
    echo()
    echo("launch (one line per node):")
    for node in plan["nodes"]:
        echo(f"  [{node['name']}] {node['torchrun']}")
    if plan["excluded"]:
        echo()
        echo("excluded:")
        for e in plan["excluded"]:
            where = e["node"] if e.get("device_index") is None else f"{e['node']} GPU {e['device_index']} ({e['gpu']})"
            echo(f"  {where}: {e['reason']}")
    for title, lines in (("notes", plan.get("notes") or []), ("warnings", plan["warnings"])):
        if lines:
            echo()
            echo(f"{title}:")
            for line in lines:
                echo(f"  - {line}")


def env_lines(plan: dict) -> list[str]:
    """Per node, shell lines a scheduler can source (``--emit env``)."""
    launch = plan.get("launch") or {}
    master = launch.get("master_addr") or (plan["nodes"][0]["name"] if plan["nodes"] else "")
    port = launch.get("master_port", DEFAULT_MASTER_PORT)
    lines = []
    for node in plan["nodes"]:
        lines.append(f"# node {node['name']}")
        lines.extend(
            [
                "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                f"CUDA_VISIBLE_DEVICES={node['cuda_visible_devices']}",
                f"NNODES={len(plan['nodes'])}",
                f"NODE_RANK={node['node_rank']}",
                f"NPROC_PER_NODE={node['nproc_per_node']}",
                f"MASTER_ADDR={master}",
                f"MASTER_PORT={port}",
            ]
        )
    return lines


def print_plan(plan: dict, *, as_json: bool, emit: str) -> None:
    """A plan on stdout in the form asked for: exact JSON, per-node environment lines, or the table."""
    if as_json:
        print_json(plan)
    elif emit == "env":
        for line in env_lines(plan):
            echo(line)
    else:
        render_plan(plan)
