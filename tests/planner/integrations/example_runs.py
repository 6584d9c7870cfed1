"""The examples of README "Training with Hugging Face, Accelerate or Lightning": each README block is the
example file, and each example runs under its framework's launch line with a plan of batches 2, 5, 9 and
accumulation 2, every rank printing its summary line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.gloo import torchrun_env
from tests.net import free_port
from tests.planner.integrations.exactness import plan_document

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()
SECTION = "## Training with Hugging Face, Accelerate or Lightning\n"


def readme_script(title: str) -> str:
    """The python block of the section's ``### title`` subsection."""
    start = README.index(f"### {title}\n", README.index(SECTION))
    end = README.find("\n### ", start + 1)
    return re.findall(r"```python\n(.*?)```", README[start:end], flags=re.DOTALL)[0]


def run_example(
    command: Callable[[int], list[str]],
    tmp_path: Path,
    timeout_s: float = 240,
    port_env: str | None = None,
    **env: str,
) -> str:
    """Run ``command(port)`` (a launch line whose last argument is the plan) in ``tmp_path`` with the plan
    written there; its stdout, after checking it exited 0. ``port_env`` names an environment variable that
    carries the port instead (Lightning's ``MASTER_PORT``). A port another process took between choosing and
    binding it (a shared machine) is tried once more with a new one."""
    (tmp_path / "plan.json").write_text(json.dumps(plan_document()))
    for attempt in range(2):
        port = free_port()
        extra = {port_env: str(port)} if port_env else {}
        result = subprocess.run(
            command(port),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=tmp_path,
            env=torchrun_env(PYTHONPATH=str(REPO), **env, **extra),
        )
        if result.returncode == 0 or attempt or "address already in use" not in result.stderr.lower():
            break
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def summaries(stdout: str, framework: str) -> dict[int, str]:
    """Every rank's summary line: rank -> its loss rule (lines of several ranks may share a pipe, so no line
    anchors)."""
    found = re.findall(
        rf"batchplan: {re.escape(framework)}, rank (\d)/3: batches \[2, 5, 9\] accumulate 2 "
        r"global batch 32; loss rule ([a-z-]+) \((?:decided|declared)\)",
        stdout,
    )
    return {int(rank): rule for rank, rule in found}


PYTHON = sys.executable
