"""README's first run: the command its set-up line ends with, run as a newcomer runs it, and the output block
README shows for it ("What a plan looks like").

``tests/test_readme_first_run.py`` compares the two, whole. When the output changes on purpose (a new
calibration, a new line in the plan's summary), regenerate the block from a real run:

    python tests/readme_first_run.py --write

It runs the command the same way the test does (a fresh working directory holding ``cluster_configs/``, an empty
profile cache, stdout to a pipe) and replaces the block's lines under its ``$ `` line; review the diff of
README.md before committing it. ``python tests/readme_first_run.py`` alone prints the difference.

Self-contained (run as a script, ``tests`` is not importable): standard library only.
"""

from __future__ import annotations

import difflib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
#: a cold run of ResNet-50 on three GPU types with Ray on the loaded 2-core machine takes 30-60 s
TIMEOUT_S = 600.0


def _blocks(text: str, language: str) -> list[tuple[int, list[str]]]:
    """(line index of the first line inside, the lines) of every ```language block of ``text``."""
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            found.append((i + 1, lines[i + 1 : end]))
            i = end
        i += 1
    return found


def first_command(text: str | None = None) -> str:
    """The command README's first set-up line ends with: the plan a newcomer sees first."""
    _, lines = _blocks(text if text is not None else README.read_text(), "bash")[0]
    return " ".join(lines).split(" && ")[-1].strip()


def documented_block(text: str | None = None) -> tuple[int, list[str]]:
    """(line index of its first output line, the output lines) of the README text block showing ``first_command``."""
    text = text if text is not None else README.read_text()
    command = first_command(text)
    for start, lines in _blocks(text, "text"):
        if lines and lines[0] == f"$ {command}":
            return start + 1, lines[1:]
    raise LookupError(
        f"README.md has no ```text block starting with '$ {command}' (the set-up line's command)"
    )


def run_first_command(workdir: Path, command: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command in ``workdir`` as a newcomer would after the set-up (the installed ``batchplan``, the
    config at the relative path the command names), with an empty profile cache of its own."""
    argv = shlex.split(command or first_command())
    for word in argv:  # the relative files the command names (cluster_configs/demo-mixed.yaml)
        source = REPO_ROOT / word
        if not os.path.isabs(word) and source.is_file():
            (workdir / word).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, workdir / word)
    script = shutil.which(argv[0], path=str(Path(sys.executable).parent)) or shutil.which(argv[0])
    if script is None:
        raise FileNotFoundError(f"{argv[0]} is not installed (pip install -e . as the README's set-up does)")
    env = {k: v for k, v in os.environ.items() if k not in ("BATCHPLAN_CACHE_DIR", "COLUMNS")}
    env["BATCHPLAN_CACHE_DIR"] = str(workdir / "profile-cache")
    return subprocess.run(
        [script, *argv[1:]], cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def difference(documented: list[str], printed: list[str]) -> str:
    return "\n".join(difflib.unified_diff(documented, printed, "README.md", "the run", lineterm=""))


def main(argv: list[str]) -> int:
    write = "--write" in argv
    start, documented = documented_block()
    with tempfile.TemporaryDirectory(prefix="readme-first-run-") as workdir:
        result = run_first_command(Path(workdir))
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        print(f"error: the command exited {result.returncode}", file=sys.stderr)
        return 1
    printed = result.stdout.rstrip("\n").split("\n")
    if printed == documented:
        print("README's first output block is what the run prints")
        return 0
    if not write:
        print(difference(documented, printed))
        return 1
    lines = README.read_text().split("\n")
    lines[start : start + len(documented)] = printed
    README.write_text("\n".join(lines))
    print(
        f"rewrote README.md's first output block ({len(documented)} -> {len(printed)} lines): review the diff"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
