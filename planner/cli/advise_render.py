"""How ``batchplan advise`` prints its result: the front as a table (or the JSON document), each point's plan
line, and the candidates left out with why."""

from __future__ import annotations

from typing import Any

from planner.cli.output import echo, print_json, print_table

#: rejected candidates printed one per line in the table form (``--json`` lists every one)
MAX_REJECTED_LINES = 12


def format_duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``, ``3.2 d``."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def format_usd(usd: float) -> str:
    return f"${usd:,.2f}" if usd >= 0.995 else f"${usd:.3g}"


def _row(point: dict[str, Any]) -> list[str]:
    low, high = point["time_per_epoch_range_s"]
    return [
        str(point["rank"]),
        point["cluster"],
        str(point["gpus"]),
        format_usd(point["price_per_hour_usd"]),
        format_duration(point["time_per_epoch_s"]),
        f"{format_duration(low)}–{format_duration(high)}",
        format_usd(point["cost_per_epoch_usd"]),
        f"{point['samples_per_s']:,.0f}",
        f"{point['comm_share']:.0%}",
        "uncalibrated: " + ", ".join(u.split(":")[0] for u in point["uncalibrated"])
        if point["uncalibrated"]
        else "",
    ]


def print_advice(document: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print_json(document)
        return
    front = document["front"]
    title = (
        f"Pareto front for {document['model']}: cost vs time per epoch of {document['epoch_samples']:,} samples "
        f"({document['offers']})"
    )
    columns = [
        "#",
        "cluster",
        "GPUs",
        "$/h",
        "time/epoch",
        "range (±1σ)",
        "$/epoch",
        "samples/s",
        "sync",
        "note",
    ]
    print_table(title, columns, [_row(p) for p in front])
    for point in front:
        echo(f"#{point['rank']}: {point['plan_command']}")
    ranks_of: dict[str, list[str]] = {}  # each uncalibrated GPU type's line once, with the points it concerns
    for point in front:
        for line in point["uncalibrated"]:
            ranks_of.setdefault(line, []).append(f"#{point['rank']}")
    for line, ranks in ranks_of.items():
        echo(f"{','.join(ranks)}: {line}")
    rejected = document["rejected"]
    if rejected:
        echo(f"rejected {len(rejected)}:")
        for entry in rejected[:MAX_REJECTED_LINES]:
            echo(f"  {entry['cluster']}: {entry['reason']}")
        if len(rejected) > MAX_REJECTED_LINES:
            echo(f"  ... {len(rejected) - MAX_REJECTED_LINES} more (--json lists each)")
    echo(
        f"candidates {document['candidates']:,}, planned {document['evaluated']:,} ({document['pruned']:,} ruled out "
        f"by their bound), front {len(front)}, in {document['seconds']:.1f} s"
    )
