"""``--emit env``: one node's launch environment as ``export`` lines a shell or a scheduler can source.

A scheduler runs one launcher per node, so it asks for one node: ``--node NAME`` (the plan's node name) or
``--node-rank N``. A plan of one node needs neither. For a plan of several nodes without a choice the
command refuses (exit 2, naming the nodes and the flags) instead of printing every node's block in a row,
where sourcing the output would leave the last node's ``NODE_RANK`` in force on every node.

The values come from the validated plan (``planner.plan.validate``) and every one is quoted with
``shlex.quote``; ``plan.json`` holds the same per node under ``nodes[].env``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from planner.errors import ConfigError

if TYPE_CHECKING:
    from planner.plan.types import Plan


def add_node_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--node", metavar="NAME", help="with --emit env: the node whose environment to print")
    group.add_argument(
        "--node-rank", type=int, metavar="N", help="with --emit env: the node, by its node rank"
    )


def check_node_options(args: argparse.Namespace) -> None:
    """``--node``/``--node-rank`` only make sense with ``--emit env`` (fail before any work)."""
    if (args.node is not None or args.node_rank is not None) and args.emit != "env":
        flag = "--node" if args.node is not None else "--node-rank"
        raise ConfigError(f"{flag} chooses the node for --emit env (add --emit env, or drop {flag})")


def selected_node_rank(plan: Plan, node: str | None, node_rank: int | None) -> int:
    """The node rank ``--node``/``--node-rank`` name in ``plan`` (the only node when there is one).

    Raises:
        ConfigError: no choice on a multi-node plan, or a choice the plan does not have.
    """
    names = [n.name for n in plan.nodes]
    listed = ", ".join(f"{i}: {name}" for i, name in enumerate(names))
    if node is not None:
        if node not in names:
            raise ConfigError(f"the plan has no node {node!r} (its nodes: {listed}; use --node NAME)")
        return names.index(node)
    if node_rank is not None:
        if not 0 <= node_rank < len(names):
            raise ConfigError(
                f"--node-rank {node_rank} is not in the plan (node ranks 0..{len(names) - 1}: {listed})"
            )
        return node_rank
    if len(names) == 1:
        return 0
    raise ConfigError(
        f"the plan has {len(names)} nodes and each needs its own environment: choose one with --node NAME or "
        f"--node-rank N (nodes {listed})"
    )


def env_lines(plan: Plan, node_rank: int) -> list[str]:
    """The ``export`` lines of ``nodes[node_rank]``, with a comment saying whose they are."""
    from planner.plan.derived import node_launch
    from planner.plan.launch import export_lines

    launch = node_launch(plan.nodes[node_rank], plan.launch, len(plan.nodes))
    name = plan.nodes[node_rank].name
    header = f"# batchplan: environment of node {name} (node rank {node_rank} of {launch.nnodes}); source it, then run torchrun"
    return [header, *export_lines(launch.env())]
