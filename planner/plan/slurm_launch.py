"""``--emit slurm``: one ``srun`` line that starts torchrun on every node of a plan inside a SLURM job.

``srun`` runs one task per node on the plan's nodes (``--nodelist``, in plan order, which is SLURM's node
order for a plan made with ``--slurm``); each task takes its node rank from ``SLURM_NODEID`` and the master
address is the plan's node rank 0, the first host. Nodes of one shape (the same rank count and device list)
share one torchrun command with ``--node-rank "$SLURM_NODEID"``; a mixed plan gets a ``case`` on
``SLURM_NODEID`` that gives each node its own device list and rank count. The shell text is built from the
validated plan with ``shlex`` like every other emitted line (``planner.plan.launch``).

Every node reads the same ``plan.json`` path: put it on a shared file system (or copy it to that path on
each node) before the ``srun``.
"""

from __future__ import annotations

import shlex

from planner.plan.derived import node_launch
from planner.plan.launch import NodeLaunch
from planner.plan.types import Plan

NODE_RANK_VAR = "SLURM_NODEID"


def _torchrun_words(launch: NodeLaunch, node_rank_word: str) -> str:
    argv = launch.torchrun_argv()
    at = argv.index("--node-rank") + 1
    words = [shlex.quote(w) for w in argv]
    words[at] = node_rank_word
    env = f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={shlex.quote(launch.cuda_visible_devices)}"
    return f"{env} exec {' '.join(words)}"


def node_script(plan: Plan) -> str:
    """The shell text each srun task runs (``bash -c`` takes it as one word)."""
    launches = [node_launch(node, plan.launch, len(plan.nodes)) for node in plan.nodes]
    shapes = {(launch.nproc_per_node, launch.cuda_visible_devices) for launch in launches}
    if len(shapes) == 1:
        return _torchrun_words(launches[0], f'"${NODE_RANK_VAR}"')
    cases = " ".join(
        f"{launch.node_rank}) {_torchrun_words(launch, str(launch.node_rank))};;" for launch in launches
    )
    unknown = f'*) echo "batchplan: ${NODE_RANK_VAR} is not a node rank of this plan" >&2; exit 2;;'
    return f'case "${NODE_RANK_VAR}" in {cases} {unknown} esac'


def srun_argv(plan: Plan) -> list[str]:
    """``srun`` and its words: one task per plan node, each running :func:`node_script`."""
    names = [node.name for node in plan.nodes]
    return [
        "srun",
        "--nodes",
        str(len(names)),
        "--ntasks-per-node",
        "1",
        "--nodelist",
        ",".join(names),
        "bash",
        "-c",
        node_script(plan),
    ]


def srun_line(plan: Plan) -> str:
    """The ``srun`` line, every word quoted."""
    return shlex.join(srun_argv(plan))
