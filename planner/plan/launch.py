"""The launch lines of a plan: one ``torchrun`` command per node, built from validated values (the master
address is shell-quoted), with the static rendezvous that keeps the plan's rank numbering."""

from __future__ import annotations

import shlex

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
