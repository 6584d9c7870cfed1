"""``batchplan devices --cluster FILE | --address ADDR``: every node's GPUs, read by its NodeProbe over Ray.

The node entries are the local ``devices`` command's (``planner.probing.node_entry``); a node whose probe died
or did not answer is listed with no host or devices and the reason as a warning.
"""

from __future__ import annotations

from planner.cluster import ClusterSpec, catalog_for
from planner.probing.backends import DEFAULT_PROBE_TIMEOUT_S, RayBackend
from planner.probing.node_entry import NodeEntry, failed_node_entry, node_entry
from planner.probing.session import ray_session


def cluster_inventory(
    *,
    cluster: ClusterSpec | None,
    address: str | None,
    select: str,
    min_free_memory_fraction: float,
    max_utilization_fraction: float,
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
) -> list[NodeEntry]:
    """Every node's inventory as ``devices --json`` node entries: the simulated ``cluster``'s, or those of
    the Ray cluster at ``address`` (``cluster`` None)."""
    catalog = catalog_for(cluster)
    with ray_session(
        address=address if cluster is None else None,
        num_simulated_nodes=len(cluster.nodes) if cluster is not None else 0,
    ) as session:
        backend = RayBackend(
            session, catalog, cluster=cluster, on_event=lambda e: None, probe_timeout_s=probe_timeout_s
        )
        inventories, failed = backend.inventories(select, min_free_memory_fraction, max_utilization_fraction)
    return [
        *map(node_entry, inventories),
        *(
            failed_node_entry(name, simulated=cluster is not None, reason=reason)
            for name, reason in failed.items()
        ),
    ]
