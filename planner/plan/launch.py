"""The launch lines of a plan: one ``torchrun`` command per node, built from validated values (the master
address is shell-quoted), with the static rendezvous that keeps the plan's rank numbering."""

from __future__ import annotations

import shlex

from planner.plan.types import Plan

#: torchrun's own default ``--master-port`` (torch.distributed.run), the plan's default
DEFAULT_MASTER_PORT = 29500


def torchrun_command(
    *,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    cuda_visible_devices: str,
    script: str,
) -> str:
    """The line to run on one node. Static rendezvous (``--node-rank`` with a master address) keeps the
    plan's rank numbering: global rank = ranks of the nodes before + local rank."""
    return (
        f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={cuda_visible_devices} "
        f"torchrun --nnodes {nnodes} --node-rank {node_rank} --nproc-per-node {nproc_per_node} "
        f"--master-addr {shlex.quote(master_addr)} --master-port {master_port} "
        f"{script} --plan plan.json"
    )


def env_lines(plan: Plan) -> list[str]:
    """Per node, shell lines a scheduler can source (``batchplan plan --emit env``), values shell-quoted."""
    launch = plan.launch
    master = (launch.master_addr if launch else None) or (plan.nodes[0].name if plan.nodes else "")
    port = launch.master_port if launch and launch.master_port is not None else DEFAULT_MASTER_PORT
    lines = []
    for node in plan.nodes:
        lines.append(f"# node {node.name}")
        lines.extend(
            [
                "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                f"CUDA_VISIBLE_DEVICES={shlex.quote(node.cuda_visible_devices)}",
                f"NNODES={len(plan.nodes)}",
                f"NODE_RANK={node.node_rank}",
                f"NPROC_PER_NODE={node.nproc_per_node}",
                f"MASTER_ADDR={shlex.quote(master)}",
                f"MASTER_PORT={port}",
            ]
        )
    return lines
