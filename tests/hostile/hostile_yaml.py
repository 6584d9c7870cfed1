"""Cluster configs under the byte limit that would still explode if read naively, written out as text: shared by
``test_hostile_yaml.py`` and ``bench/bench_config_limits.py`` (which times them)."""

from __future__ import annotations

from collections.abc import Callable

#: nine levels of nine aliases: 9^10 scalars once expanded, a few hundred bytes written
_BOMB_LEVELS = "bcdefghij"


def _bomb_levels(indent: str, entry: Callable[[str, str], str]) -> str:
    """``entry(anchor, value)`` lines, the first anchoring nine scalars, each next one nine aliases of the last."""
    lines = [entry("a", "[lol, lol, lol, lol, lol, lol, lol, lol, lol]")]
    previous = "a"
    for anchor in _BOMB_LEVELS:
        lines.append(entry(anchor, "[" + ", ".join([f"*{previous}"] * 9) + "]"))
        previous = anchor
    return "".join(indent + line + "\n" for line in lines)


def alias_bomb_node_names() -> str:
    """Every node's name one level of the bomb."""
    return "nodes:\n" + _bomb_levels(
        "  ", lambda anchor, value: f"- {{name: &{anchor} {value}, gpus: [{{type: T4}}]}}"
    )


def alias_bomb_gpu_counts() -> str:
    """Every GPU entry's count one level of the bomb."""
    return "nodes:\n  - name: n\n    gpus:\n" + _bomb_levels(
        "      ", lambda a, v: f"- {{type: T4, count: &{a} {v}}}"
    )


def alias_bomb_gpu_types() -> str:
    """Every GPU entry's type one level of the bomb."""
    return "nodes:\n  - name: n\n    gpus:\n" + _bomb_levels("      ", lambda a, v: f"- {{type: &{a} {v}}}")


def aliased_huge_names(num_nodes: int = 16_384, name_bytes: int = 2**20) -> str:
    """``num_nodes`` nodes all named by one alias of a ``name_bytes`` name: 16 GiB once each name is rendered."""
    first = f"  - {{name: &n {'x' * name_bytes}, gpus: [{{type: T4}}]}}\n"
    return "nodes:\n" + first + "  - {name: *n, gpus: [{type: T4}]}\n" * (num_nodes - 1)


def flow_list_under_nodes(num_bytes: int = 16 * 2**20 - 64) -> str:
    """One flow list of ``num_bytes`` under ``nodes:`` (8 million one-letter items)."""
    return "nodes: [" + "a," * (num_bytes // 2 - 8) + "a]\n"


def nodes_of(num_nodes: int, gpus_per_node: int, gpu_type: str = "T4") -> str:
    """``num_nodes`` nodes of ``gpus_per_node`` GPUs each, one line a node."""
    return "nodes:\n" + "".join(
        f"  - {{name: n{i}, gpus: [{{type: {gpu_type}, count: {gpus_per_node}}}]}}\n"
        for i in range(num_nodes)
    )


#: configs over a limit: name -> (text, words the error names)
OVER_THE_LIMIT: dict[str, tuple[Callable[[], str], tuple[str, ...]]] = {
    "alias bomb as node names": (alias_bomb_node_names, ("aliases", "limit")),
    "alias bomb as GPU counts": (alias_bomb_gpu_counts, ("aliases", "limit")),
    "alias bomb as GPU types": (alias_bomb_gpu_types, ("aliases", "limit")),
    "16,384 aliases of a 1 MiB name": (aliased_huge_names, ("aliases", "limit")),
    "a 16 MiB flow list under nodes": (flow_list_under_nodes, ("nodes", "16384")),
    "16,385 nodes": (lambda: nodes_of(16_385, 1), ("nodes", "16384")),
    "16,384 nodes of 256 GPUs": (lambda: nodes_of(16_384, 256), ("GPUs", "65536")),
}
