"""``batchplan devices --cluster FILE | --address ADDR``: every node's GPUs, read by its NodeProbe over Ray.

The node entries have the same shape as the local ``devices`` command's (``NodeInventory.to_json``); a
node whose probe died or did not answer is listed with no devices and the reason as a warning.
"""

from __future__ import annotations

from planner.cluster import ClusterSpec, catalog_for
from planner.probing.backends import DEFAULT_PROBE_TIMEOUT_S, RayBackend
from planner.probing.session import ray_session


def cluster_inventory(
    *,
    cluster: ClusterSpec | None,
    address: str | None,
    select: str,
    min_free_memory_fraction: float,
    max_utilization_fraction: float,
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
) -> list[dict]:
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
    nodes = [inventory.to_json() for inventory in inventories]
    for name, reason in failed.items():
        nodes.append(
            {
                "name": name,
                "simulated": cluster is not None,
                "ray_node_id": None,
                "probe_pid": None,
                "driver": None,
                "host": None,
                "devices": [],
                "selected": [],
                "skipped": [],
                "warnings": [f"probe failed: {reason}"],
            }
        )
    return nodes
