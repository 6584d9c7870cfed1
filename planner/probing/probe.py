"""``NodeProbe``, the Ray actor that reports what a node has (``planner.probing.inventory``) and profiles it.

The inventory and profiling functions are plain functions: the Ray layer runs them inside one ``NodeProbe``
actor per node, pinned with hard node affinity; ``planner.driver`` can run the very same functions
in-process (no Ray), which is how a Ray plan is checked against a plan made without Ray.

GPU visibility: a Ray actor that asks for ``num_gpus=0`` gets ``CUDA_VISIBLE_DEVICES=""`` and would see no
GPU. The probe asks for no GPUs (it must see the busy ones too, and must not wait for GPUs other jobs hold)
and instead turns Ray's masking off for its own process with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``
in its runtime environment, so it sees every GPU the node's raylet sees.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from planner.cluster import NodeSpec
from planner.job import JobSpec
from planner.probing.inventory import NodeInventory, real_inventory, simulated_inventory
from torchkit.hardware.catalog import GpuCatalog

#: Ray must not mask GPUs for the probe; CUDA must number GPUs as NVML does (PCI order), so that an
#: NVML index from the inventory is the CUDA index the probe measures on
PROBE_ENV_VARS = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class NodeProbe:
    """Answers for one node (or, past the raylet cap, a group of simulated nodes) of a cluster.

    The driver wraps it with ``ray.remote`` and pins each instance to its node with
    ``NodeAffinitySchedulingStrategy(node_id, soft=False)``.
    """

    def __init__(
        self, simulated_nodes: Sequence[NodeSpec] | None, catalog: GpuCatalog, user_dirs: Sequence[str] = ()
    ) -> None:
        import sys

        # where the driver found the user's factory: searched after everything else, never before the
        # standard library. Ray itself puts the driver's working directory first on every worker's path
        # (job_config py_driver_sys_path); move it to the end, where a json.py lying there replaces nothing
        for directory in user_dirs:
            while directory in sys.path:
                sys.path.remove(directory)
            sys.path.append(directory)
        self._simulated = {n.name: n for n in simulated_nodes} if simulated_nodes is not None else None
        self._catalog = catalog
        self._estimates_cache: dict = {}

    def identity(self) -> dict:
        import ray

        return {"ray_node_id": ray.get_runtime_context().get_node_id(), "probe_pid": os.getpid()}

    def torch_imported(self) -> bool:
        """Whether this probe process has imported torch: a plan from cached profiles should not need it
        (importing torch costs seconds and a few hundred MiB per probe)."""
        import sys

        return "torch" in sys.modules

    def inventory(
        self,
        select: str = "all",
        min_free_memory_fraction: float = 0.0,
        max_utilization_fraction: float = 1.0,
    ) -> list[NodeInventory]:
        ident = self.identity()
        thresholds = {
            "select": select,
            "min_free_memory_fraction": min_free_memory_fraction,
            "max_utilization_fraction": max_utilization_fraction,
        }
        if self._simulated is None:
            found = [real_inventory(self._catalog, **thresholds)]
        else:
            found = [simulated_inventory(node, **thresholds) for node in self._simulated.values()]
        return [inv.with_probe(**ident) for inv in found]

    def free_port(self) -> int:
        """A TCP port free on this node now, for the link probe's rendezvous (the OS picks it)."""
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def allreduce_probe(
        self, rank: int, world: int, master_addr: str, master_port: int, sizes: Sequence[int], repeats: int
    ) -> list[float]:
        """Time an all-reduce among the probes (``planner.probing.link_probe``); medians per size."""
        from planner.probing.link_probe import timed_allreduce

        return timed_allreduce(rank, world, master_addr, master_port, sizes, repeats)

    def profile(
        self,
        job: JobSpec,
        gpu_type: str,
        method: str,
        device_index: int | None = None,
        progress_key: str | None = None,
    ) -> dict:
        """Profile one GPU type for the job; returns the ``DeviceProfile`` (``profile``) and the probe's identity.
        Its progress lines go to ``progress_key`` of the cluster's key-value store
        (``planner.probing.progress_relay``)."""
        from planner.obtain.make import make_profile
        from planner.probing.progress_relay import relayed_progress

        with relayed_progress(progress_key):
            profile = make_profile(
                job,
                self._catalog.get(gpu_type),
                method=method,
                device_index=device_index,
                estimates_cache=self._estimates_cache,
            )
        return {"profile": profile, **self.identity()}
