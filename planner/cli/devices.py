"""``batchplan devices``: the GPUs of this machine (or of a cluster's nodes) with memory, utilisation,
temperature, power and the processes holding them, and which GPUs a ``--select`` spec would use.

Computed first (``local_node_inventory`` → a ``planner.probing.node_entry.NodeEntry``), rendered second
(``render_nodes``, or ``--json``: the entries through ``planner.codec``), so the Ray path
(``planner.probing.cluster_devices.cluster_inventory``) returns the same entries and shares the renderer. On a machine without an NVIDIA driver it lists the host only, says why on stderr, and exits 0.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from planner.cli.output import echo, format_gib, note, print_json, print_table
from planner.codec import encode
from planner.errors import ConfigError
from planner.job import DEFAULT_MAX_UTILIZATION_FRACTION, DEFAULT_MIN_FREE_MEMORY_FRACTION
from planner.probing.node_entry import SCHEMA, DeviceEntry, DevicesDocument, NodeEntry, node_entry

# the selection shown when --select is not given: "which GPU would -1 pick"
DEFAULT_SELECT = "-1"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "devices",
        help="list GPUs with memory, utilisation and processes, and which ones a selection would use",
        description=(
            "List the GPUs of this machine (NVML), or of every node of a cluster, with memory, utilisation, "
            "temperature, power and the processes holding them, and show which GPUs --select would use."
        ),
    )
    target = p.add_mutually_exclusive_group()
    target.add_argument("--cluster", metavar="FILE", help="a simulated cluster config (YAML)")
    target.add_argument(
        "--address", metavar="ADDR", help="a Ray cluster address ('auto' for the running one)"
    )
    p.add_argument(
        "--select",
        metavar="SPEC",
        default=None,
        help="GPUs to use: 'all', '-1' (the most idle), '-1,-1' (the two most idle) or indices like '0,2' "
        f"(default: show what '{DEFAULT_SELECT}' would pick)",
    )
    p.add_argument(
        "--min-memory-fraction",
        type=float,
        default=DEFAULT_MIN_FREE_MEMORY_FRACTION,
        metavar="F",
        help=f"only GPUs with at least this share of their memory free (0..1, default {DEFAULT_MIN_FREE_MEMORY_FRACTION}"
        ", as plan)",
    )
    p.add_argument(
        "--max-utilization",
        type=float,
        default=DEFAULT_MAX_UTILIZATION_FRACTION,
        metavar="F",
        help=f"only GPUs at most this busy (0..1, default {DEFAULT_MAX_UTILIZATION_FRACTION}, as plan)",
    )
    p.add_argument(
        "--no-ray",
        action="store_true",
        help="with --cluster: read the simulated nodes in this process, no Ray",
    )
    p.add_argument("--json", action="store_true", help=f"print JSON ({SCHEMA}) instead of a table")
    p.set_defaults(func=run)


# ------------------------------------------------------------------------------------------------ compute


def validate_selection_options(
    select: str, min_free_memory_fraction: float, max_utilization_fraction: float
) -> None:
    """Check a selection spec and its thresholds before anything is probed.

    Raises:
        ConfigError: a fraction outside [0, 1] or a malformed spec.
    """
    from torchkit.hardware.gpu_select import parse_select_spec

    for flag, value in (
        ("--min-memory-fraction", min_free_memory_fraction),
        ("--max-utilization", max_utilization_fraction),
    ):
        if not 0.0 <= value <= 1.0:  # also rejects nan
            raise ConfigError(f"{flag} must be a fraction in [0, 1], got {value!r} (e.g. 0.2 for 20%)")
    parse_select_spec(select)


def local_node_inventory(
    select: str = "all", min_free_memory_fraction: float = 0.0, max_utilization_fraction: float = 1.0
) -> NodeEntry:
    """This machine's node entry, read through NVML.

    Without NVML (no driver, no pynvml) the node has no devices and one warning saying why.

    Raises:
        ConfigError: malformed spec or thresholds, or an index this machine does not have.
    """
    from planner.cluster import catalog_for
    from planner.probing.inventory import real_inventory

    validate_selection_options(select, min_free_memory_fraction, max_utilization_fraction)
    inventory = real_inventory(
        catalog_for(None),
        select=select,
        min_free_memory_fraction=min_free_memory_fraction,
        max_utilization_fraction=max_utilization_fraction,
    )
    return node_entry(inventory.with_probe(ray_node_id=None, probe_pid=os.getpid()))


# ------------------------------------------------------------------------------------------------ render


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def _power(device: DeviceEntry) -> str:
    draw, limit = device.power_w, device.power_limit_w
    if draw is None:
        return "-"
    return f"{draw:.0f}" if limit is None else f"{draw:.0f}/{limit:.0f}"


def _processes(device: DeviceEntry) -> str:
    parts = []
    for p in device.processes:
        memory = "" if p.used_memory_bytes is None else f" {format_gib(p.used_memory_bytes)} GiB"
        parts.append(f"{p.pid} {p.name or '?'}{memory}")
    return ", ".join(parts) or "-"


def _selection_line(node: NodeEntry, select: str, explicit: bool) -> str:
    names = {d.index: d.name for d in node.devices}
    picked = ", ".join(f"GPU {i} ({names.get(i, '?')})" for i in node.selected) or "nothing"
    head = f"--select {select} picks" if explicit else f"{select} would pick"
    return f"{head}: {picked}"


def _host_line(node: NodeEntry) -> str:
    host = node.host
    if host is None:  # its probe failed: the reason is its warning
        return f"{node.name}: host unknown"
    cpus = "CPU count unknown" if host.cpu_count is None else f"{host.cpu_count} CPUs"
    memory = (
        "memory unknown"
        if host.memory_total_bytes is None
        else f"{format_gib(host.memory_total_bytes)} GiB memory"
    )
    line = f"{node.name}: {host.cpu}, {cpus}, {memory}"
    driver = node.driver
    if driver:
        line += (
            f"; NVIDIA driver {driver.get('driver_version') or '?'}, "
            f"CUDA {driver.get('cuda_driver_version') or '?'}"
        )
    return line


def render_nodes(nodes: Sequence[NodeEntry], *, select: str, explicit: bool) -> None:
    """Tables on stdout, one per node: a host line, one row per GPU (with "picked" or why not), and a line
    naming the GPUs the selection picks."""
    for number, node in enumerate(nodes):
        if number:
            echo()
        echo(_host_line(node))
        if not node.devices:
            echo("no GPUs")
            continue
        status = {s.device_index: s.reason for s in node.skipped}
        status.update({i: "picked" for i in node.selected})
        rows = [
            [
                d.index,
                d.name,
                f"{format_gib(d.memory_used_bytes)}/{format_gib(d.memory_total_bytes)}",
                _percent(d.utilization),
                "-" if d.temperature_c is None else f"{d.temperature_c}C",
                _power(d),
                _processes(d),
                status.get(d.index, "-"),
            ]
            for d in node.devices
        ]
        columns = ["idx", "name", "memory GiB", "util", "temp", "power W", "processes", "selection"]
        print_table(None, columns, rows)
        echo(_selection_line(node, select, explicit))


# ------------------------------------------------------------------------------------------------ command


def run(args: argparse.Namespace) -> int:
    explicit = args.select is not None
    args.select = args.select if explicit else DEFAULT_SELECT
    validate_selection_options(args.select, args.min_memory_fraction, args.max_utilization)
    if args.no_ray and not args.cluster:
        from planner.errors import ConfigError

        raise ConfigError("--no-ray needs --cluster FILE (a real cluster is read through Ray)")
    if args.cluster and args.no_ray:
        from planner.cluster import load_cluster
        from planner.probing.backends import LocalBackend

        inventories, _ = LocalBackend(load_cluster(args.cluster)).inventories(
            args.select, args.min_memory_fraction, args.max_utilization
        )
        nodes = [node_entry(inventory) for inventory in inventories]
    elif args.cluster or args.address:
        from planner.cli.stdout_guard import stdout_to_stderr
        from planner.cluster import load_cluster
        from planner.probing.cluster_devices import cluster_inventory

        with stdout_to_stderr():  # Ray's "(raylet) ..." lines must not precede the result
            nodes = cluster_inventory(
                cluster=load_cluster(args.cluster) if args.cluster else None,
                address=args.address,
                select=args.select,
                min_free_memory_fraction=args.min_memory_fraction,
                max_utilization_fraction=args.max_utilization,
            )
    else:
        nodes = [local_node_inventory(args.select, args.min_memory_fraction, args.max_utilization)]
    for node in nodes:
        prefix = f"{node.name}: " if len(nodes) > 1 else ""
        for warning in node.warnings:
            note(f"warning: {prefix}{warning}")
    if args.json:
        print_json(encode(DevicesDocument(nodes=tuple(nodes))))
    else:
        render_nodes(nodes, select=args.select, explicit=explicit)
    return 0
