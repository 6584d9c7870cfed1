"""Where the probe functions run: ``RayBackend`` (one ``NodeProbe`` actor per node, pinned with hard node
affinity; a real cluster or a simulated one on 127.0.0.1) and ``LocalBackend`` (the same functions called
in this process, for a cluster config; no Ray). ``planner.driver`` runs the same pipeline over either.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import uuid
from collections.abc import Sequence, Set
from typing import Any, Protocol

from planner.cluster import ClusterSpec
from planner.events import Event, EventSink
from planner.obtain.make import factory_search_dirs, make_profile
from planner.obtain.method import planned_method
from planner.obtain.request import ProfileRequest
from planner.probing.inventory import NodeInventory, simulated_inventory
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import GpuCatalog

log = logging.getLogger(__name__)

#: seconds a probe may take to start and report its inventory (a Ray worker start plus NVML reads)
DEFAULT_PROBE_TIMEOUT_S = 120.0
#: seconds one profile may take (fake passes, or measured steps on a real GPU)
DEFAULT_PROFILE_TIMEOUT_S = 900.0


class ProbeFailure(Exception):
    """A probe died, timed out or raised; ``node`` is the node it answered for."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


class Backend(Protocol):
    def inventories(
        self, select: str, min_free_memory_fraction: float, max_utilization_fraction: float
    ) -> tuple[list[NodeInventory], dict[str, str]]:
        """Inventories of the nodes that answered (with ``select`` applied), and failures ``{node: reason}``."""

    def profile(self, request: ProfileRequest, avoid: Set[str]) -> tuple[DeviceProfile, str]:
        """Make one profile (``planner.obtain.make_profile``) on a probe not in ``avoid``: on
        ``request.node`` when it names one; returns the profile and the node that made it.

        Raises ProbeFailure (the probe is unusable) or a UserError (the job itself is bad)."""

    def probing_metadata(self) -> dict: ...

    def num_probes(self) -> int:
        """How many nodes (probes, for a real cluster) will answer: what the progress line counts."""


class LocalBackend:
    """Runs the probe functions in this process for a cluster config (no Ray)."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self._cache: dict = {}

    def inventories(
        self, select: str, min_free_memory_fraction: float, max_utilization_fraction: float
    ) -> tuple[list[NodeInventory], dict[str, str]]:
        found = [
            simulated_inventory(
                node,
                select=select,
                min_free_memory_fraction=min_free_memory_fraction,
                max_utilization_fraction=max_utilization_fraction,
            ).with_probe(ray_node_id=None, probe_pid=os.getpid())
            for node in self.cluster.nodes
        ]
        return found, {}

    def profile(self, request: ProfileRequest, avoid: Set[str]) -> tuple[DeviceProfile, str]:
        profile = make_profile(
            request.job,
            request.gpu,
            method=request.method,
            device_index=request.device_index,
            estimates_cache=self._cache,
        )
        return profile, request.node or "local"

    def probing_metadata(self) -> dict:
        return {"backend": "local", "simulated": True, "probe_processes": 1}

    def num_probes(self) -> int:
        return len(self.cluster.nodes)


def probe_env(model: str) -> dict[str, str]:
    """Environment variables a probe process needs (``planner.probing.probe.PROBE_ENV_VARS``; a user factory's
    directories travel as an argument of the probe, not in the environment). ``model`` is unused since then
    but kept so that callers say whose probes these are."""
    from planner.probing.probe import PROBE_ENV_VARS

    del model
    return dict(PROBE_ENV_VARS)


class RayBackend:
    """One NodeProbe actor per node (per raylet group for large simulated clusters), hard-pinned."""

    def __init__(
        self,
        session,
        catalog: GpuCatalog,
        *,
        cluster: ClusterSpec | None,
        on_event: EventSink,
        model: str = "",
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from planner.probing.probe import NodeProbe
        from planner.probing.session import deal_round_robin

        self._ray = ray
        self.probe_timeout_s = probe_timeout_s
        self.profile_timeout_s = profile_timeout_s
        self.on_event = on_event
        self.run_id = uuid.uuid4().hex[:8]
        self._profiles_asked = itertools.count()  # each profile's progress key
        env_vars = probe_env(model)
        # a cluster started here gave its workers these already: no runtime_env, so idle workers are reused
        runtime_env = {} if session.worker_env == env_vars else {"runtime_env": {"env_vars": env_vars}}
        # a user factory must be importable in the probe as it is here: the probe appends these to its
        # sys.path (not PYTHONPATH, which comes before the standard library: a json.py there would win)
        factory_dirs = factory_search_dirs(model)
        remote_probe = ray.remote(NodeProbe)

        # group -> (ray node, simulated node specs or None for a real node)
        groups: dict[str, tuple[Any, list | None]] = {}
        if cluster is not None:
            placement = deal_round_robin([n.name for n in cluster.nodes], session.nodes)
            for node in cluster.nodes:
                ray_node = placement[node.name]
                group = groups.setdefault(ray_node.node_id, (ray_node, []))
                group[1].append(node)
            self.simulated = True
        else:
            targets = session.gpu_nodes() or session.nodes
            for ray_node in targets:
                groups[ray_node.node_id] = (ray_node, None)
            self.simulated = False
        self.num_raylets = len(session.nodes)

        self.actors: dict[str, Any] = {}  # group id -> actor handle
        self.actor_names: dict[str, str] = {}
        self.group_nodes: dict[str, list[str]] = {}  # group id -> node names it answers for
        self.actor_addresses: dict[
            str, str
        ] = {}  # group id -> its node's address (the link probe's rendezvous)
        for group_id, (ray_node, sim_nodes) in groups.items():
            self.actor_addresses[group_id] = ray_node.address
            # a real node by address and Ray node id: several raylets may share one host's address
            label = sim_nodes[0].name if sim_nodes else f"{ray_node.address}-{ray_node.node_id[:8]}"
            name = f"batchplan-probe-{label}-{self.run_id}"
            self.actor_names[group_id] = name
            self.actors[group_id] = remote_probe.options(
                name=name,
                namespace="batchplan",
                num_cpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node.node_id, soft=False),
                **runtime_env,
            ).remote(sim_nodes, catalog, factory_dirs)
            self.group_nodes[group_id] = [n.name for n in sim_nodes] if sim_nodes else []
        self.dead_groups: dict[str, str] = {}
        self.node_group: dict[str, str] = {}
        # simulated nodes are reported in config order, however they were dealt onto raylets
        self._config_order = {n.name: i for i, n in enumerate(cluster.nodes)} if cluster is not None else {}

    def _fail(self, group_id: str, reason: str) -> None:
        self.dead_groups[group_id] = reason
        actor = self.actors.get(group_id)
        if actor is not None:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # already dead
                log.debug("probe %s already gone", group_id)

    def _wait_relaying(
        self, refs: dict, timeout_s: float, key: str, item: str, node: str
    ) -> tuple[dict, dict]:
        """``_wait``, and meanwhile the probe's progress lines under ``key`` as ``profile``/``progress`` events,
        about once a second (``planner.probing.progress_relay``)."""
        from planner.probing import progress_relay

        seen = [0]

        def relay() -> None:
            for line in progress_relay.new_lines(key, seen[0]):
                seen[0] += 1
                self.on_event(
                    Event(
                        stage="profile", status="progress", item=item, detail={"node": node, "message": line}
                    )
                )

        try:
            return self._wait(refs, timeout_s, poll=relay)
        finally:
            progress_relay.forget(key)

    def _wait(self, refs: dict, timeout_s: float, poll=None) -> tuple[dict, dict]:
        """Wait for ``{group: ref}``; returns (results, failures) with failure reasons. ``poll``: called about
        once a second while waiting, and once at the end."""
        ray = self._ray
        results: dict = {}
        failures: dict = {}
        pending = dict(refs)
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _ = ray.wait(
                list(pending.values()),
                num_returns=1,
                timeout=remaining if poll is None else min(remaining, 1.0),
            )
            if poll is not None:
                poll()
            for ref in ready:
                group_id = next(g for g, r in pending.items() if r == ref)
                del pending[group_id]
                try:
                    results[group_id] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    failures[group_id] = f"probe process died ({type(exc).__name__})"
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                    failures[group_id] = cause
                except ray.exceptions.GetTimeoutError:
                    failures[group_id] = "probe timed out"
        for group_id in pending:
            failures[group_id] = f"probe did not answer within {timeout_s:.0f} s (timed out)"
        return results, failures

    def inventories(
        self, select: str, min_free_memory_fraction: float, max_utilization_fraction: float
    ) -> tuple[list[NodeInventory], dict[str, str]]:
        refs = {
            g: a.inventory.remote(select, min_free_memory_fraction, max_utilization_fraction)
            for g, a in self.actors.items()
        }
        results, failures = self._wait(refs, self.probe_timeout_s)
        found: list[NodeInventory] = []
        failed_nodes: dict[str, str] = {}
        for group_id in self.actors:
            if group_id in results:
                for inventory in results[group_id]:
                    found.append(inventory)
                    self.node_group[inventory.name] = group_id
            else:
                reason = failures[group_id]
                if not isinstance(reason, str):
                    raise reason  # a user error raised inside the probe (bad --gpus, ...)
                self._fail(group_id, reason)
                for node in self.group_nodes[group_id] or [self.actor_names[group_id]]:
                    failed_nodes[node] = reason
        found.sort(key=lambda inventory: self._config_order.get(inventory.name, len(self._config_order)))
        return found, failed_nodes

    def profile(self, request: ProfileRequest, avoid: Set[str]) -> tuple[DeviceProfile, str]:
        if request.node is not None:
            candidates = [self.node_group[request.node]] if request.node in self.node_group else []
        else:
            candidates = list(dict.fromkeys(self.node_group.values()))
        candidates = [
            g for g in candidates if g not in self.dead_groups and not set(self.group_nodes[g] or [g]) & avoid
        ]
        if not candidates:
            raise ProbeFailure(request.node or "", "no live probe left to profile on")
        group_id = candidates[0]
        node = request.node or (self.group_nodes[group_id][0] if self.group_nodes[group_id] else group_id)
        self.on_event(
            Event(
                stage="profile",
                status="start",
                item=request.gpu.name,
                detail={
                    "node": node,
                    "actor_name": self.actor_names[group_id],
                    "method": planned_method(request.method, request.device_index).value,
                },
            )
        )
        key = f"progress/{self.run_id}/{next(self._profiles_asked)}"
        ref = self.actors[group_id].profile.remote(
            request.job, request.gpu.name, request.method.value, request.device_index, key
        )
        results, failures = self._wait_relaying(
            {group_id: ref}, self.profile_timeout_s, key, request.gpu.name, node
        )
        if group_id in results:
            return results[group_id]["profile"], node
        reason = failures[group_id]
        if not isinstance(reason, str):
            raise reason
        self._fail(group_id, reason)
        raise ProbeFailure(node, reason)

    def num_probes(self) -> int:
        return sum(len(nodes) or 1 for nodes in self.group_nodes.values())

    def measure_network(
        self, sizes: Sequence[int], repeats: int, timeout_s: float
    ) -> tuple[list[float], int]:
        """A timed all-reduce among the live probes of a real cluster (one per node): (median seconds per size
        from rank 0, number of probes). Raises ProbeFailure when a probe fails or times out."""
        live = [g for g in self.actors if g not in self.dead_groups]
        master = self.actor_addresses[live[0]]
        port = self._ray.get(self.actors[live[0]].free_port.remote(), timeout=self.probe_timeout_s)
        refs = {
            g: self.actors[g].allreduce_probe.remote(rank, len(live), master, port, list(sizes), repeats)
            for rank, g in enumerate(live)
        }
        results, failures = self._wait(refs, timeout_s)
        if failures:
            group, reason = next(iter(failures.items()))
            raise ProbeFailure(self.actor_names[group], f"link probe failed: {reason}")
        return results[live[0]], len(live)

    def probing_metadata(self) -> dict:
        live = [actor for group, actor in self.actors.items() if group not in self.dead_groups]
        answers, _ = self._wait(
            {i: actor.torch_imported.remote() for i, actor in enumerate(live)}, timeout_s=10.0
        )
        return {
            "probes_imported_torch": sum(1 for imported in answers.values() if imported is True),
            "backend": "ray",
            "simulated": self.simulated,
            "raylets": self.num_raylets,
            "probe_processes": len(self.actors),
            "shared_probes": any(len(nodes) > 1 for nodes in self.group_nodes.values()),
        }
