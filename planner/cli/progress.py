"""Progress of probing and profiling on stderr: a rich progress display on a terminal, log lines otherwise."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from planner.events import Event, EventSink

# (stage, status) or, where the wording depends on it, (stage, status, method)
_LABELS: dict[tuple[str, ...], str] = {
    ("ray", "start"): "starting Ray ({item})",
    ("ray", "done"): "Ray up: {raylets} raylet(s)",
    ("probe", "start"): "probing {item}",
    ("probe", "done"): "probed {nodes} node(s), {failed} failed",
    ("profile", "start", "estimate"): "estimating {item} on fake tensors (in the probe on {node})",
    ("profile", "start", "measure"): "measuring {item} on {node}",
    ("profile", "start"): "profiling {item} ({method}) on {node}",
    ("profile", "progress"): "{item}: {message} (in the probe on {node})",
    ("profile", "done"): "profiled {item}",
    ("profile", "cached"): "profile of {item} from cache",
    ("profile", "failed"): "profiling {item} failed on {node}: {reason}",
    ("allocate", "start"): "allocating batches over {item}",
    ("allocate", "done"): "allocated",
}


def describe(event: Event) -> str:
    template = _LABELS.get(
        (event.stage, event.status, event.detail.get("method")),
        _LABELS.get((event.stage, event.status), "{stage} {status} {item}"),
    )
    values = {
        "stage": event.stage,
        "status": event.status,
        "item": event.item,
        "node": "?",
        "method": "?",
        "reason": "?",
        "raylets": "?",
        "nodes": "?",
        "failed": "?",
        "message": "",
        **event.detail,
    }
    return template.format(**values)


@contextlib.contextmanager
def progress_sink() -> Iterator[EventSink]:
    """An event sink for the driver: a spinner with the current step on a terminal, one line per step else."""
    if not sys.stderr.isatty():
        yield lambda event: sys.stderr.write(describe(event) + "\n")
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=None)

        def sink(event: Event) -> None:
            text = describe(event)
            progress.update(task, description=text)
            if event.status in ("done", "cached", "failed"):
                progress.console.print(text)

        yield sink
