"""Run what batchplan printed the way a user or a scheduler would — sourced by bash, launch lines pasted —
with a fake ``torchrun`` first on PATH that only records its arguments and environment. Nothing real is
started; an injected command (``touch MARKER``) would still run, which is what the hostile tests look for.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

#: the variables a node's environment sets (DESIGN.md: --emit env)
ENV_NAMES = (
    "CUDA_DEVICE_ORDER",
    "CUDA_VISIBLE_DEVICES",
    "NNODES",
    "NODE_RANK",
    "NPROC_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
)

_FAKE_TORCHRUN = """#!{python}
import json, os, sys
with open({record!r}, "a") as handle:
    handle.write(json.dumps({{"argv": sys.argv[1:], "env": {{n: os.environ.get(n) for n in {names!r}}}}}) + "\\n")
"""


class Sandbox:
    """A directory with a fake ``torchrun`` on PATH, and the calls it recorded."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.record = root / "torchrun-calls.jsonl"
        fake = self.bin / "torchrun"
        fake.write_text(
            _FAKE_TORCHRUN.format(python=sys.executable, record=str(self.record), names=ENV_NAMES)
        )
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    def bash(self, script: str) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with bash in the sandbox, the fake torchrun first on PATH, no inherited job env."""
        env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(
            ["bash", "-c", script], cwd=self.root, env=env, capture_output=True, text=True, timeout=60
        )

    def calls(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


def launch_lines(table: str) -> list[str]:
    """The torchrun lines of a printed plan table (``launch (one line per node):`` then ``  [node] LINE``)."""
    lines = table.splitlines()
    if "launch (one line per node):" not in lines:
        return []
    start = lines.index("launch (one line per node):") + 1
    found = []
    for line in lines[start:]:
        if not line.startswith("  ["):
            break
        found.append(line.split("] ", 1)[1])
    return found
