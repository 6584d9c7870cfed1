"""``batchplan devices --cluster FILE | --address ADDR``: every node's GPUs, read by its NodeProbe over Ray.

The node entries have the same shape as the local ``devices`` command's (``NodeInventory.to_json``); a
node whose probe died or did not answer is listed with no devices and the reason as a warning.
"""

from __future__ import annotations

import argparse

from planner.probing.backends import DEFAULT_PROBE_TIMEOUT_S, RayBackend


def cluster_inventory(args: argparse.Namespace) -> list[dict]:
    from planner.probing.session import ray_session
    from torchkit.hardware.catalog import load_catalog

    cluster = None
    if args.cluster:
        from planner.cluster import load_cluster

        cluster = load_cluster(args.cluster)
    catalog = cluster.catalog if cluster is not None else load_catalog()
    timeout_s = getattr(args, "probe_timeout", None) or DEFAULT_PROBE_TIMEOUT_S
    with ray_session(
        address=args.address if cluster is None else None,
        num_simulated_nodes=len(cluster.nodes) if cluster is not None else 0,
    ) as session:
        backend = RayBackend(
            session, catalog, cluster=cluster, on_event=lambda e: None, probe_timeout_s=timeout_s
        )
        inventories, failed = backend.inventories(args.select, args.min_memory_fraction, args.max_utilization)
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
