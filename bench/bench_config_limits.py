"""Time and memory of reading hostile cluster configs, and of planning one at the stated limits.

Usage: ``python bench/bench_config_limits.py [--plan-at-limit]``.

Each over-limit case runs in a fresh ``python -m planner.cli.main plan --no-ray --cluster FILE --model
resnet18`` subprocess (what a user's command costs before it fails on the config, interpreter start
included); the config at every limit is read by ``planner.cluster.load_cluster`` in a fresh interpreter. Each
prints one line,
``case=... exit=N wall_s=X cpu_s=C max_rss_mib=Y``: the wall time, the CPU time (user + system) and the peak
resident memory of the child (``wait4``'s rusage of that child alone). Goals (issue 25): every over-limit or
aliased config fails in < 2 s and < 100 MiB. With ``--plan-at-limit`` it also plans the largest config that
is allowed (16,384 nodes of 4 GPUs: 65,536 ranks, a plan's limit) with ``plan --no-ray`` and prints its time.

Wall times depend on the machine's load: run it on an idle machine, or read cpu_s and max_rss, which
depend on it far less. The configs are written by ``tests/hostile/hostile_yaml.py`` (the same the tests use).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.hostile.hostile_yaml import OVER_THE_LIMIT, nodes_of  # noqa: E402

TINY_MODEL = ("--model", "tests.planner.tiny_models:convnet", "--input-shape", "3,32,32")


def _run(args: list[str], cwd: Path) -> tuple[int, float, float, float]:
    """exit code, wall seconds, CPU seconds (user + system) and peak RSS (MiB) of ``python ARGS`` in a
    subprocess."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: its own rusage is what RUSAGE_CHILDREN reports once it is reaped
        os.chdir(cwd)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the result is not the figure
        os.dup2(devnull, 2)
        os.execve(sys.executable, [sys.executable, *args], env)
    _, status, usage = os.wait4(pid, 0)
    wall_s = time.perf_counter() - start
    cpu_s = usage.ru_utime + usage.ru_stime
    return os.waitstatus_to_exitcode(status), wall_s, cpu_s, usage.ru_maxrss / 1024  # ru_maxrss: KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--plan-at-limit", action="store_true", help="also plan 16,384 nodes × 4 GPUs (minutes)"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        where = Path(tmp)
        cli = ["-m", "planner.cli.main"]
        cases = {
            name: (make, [*cli, "plan", "--no-ray", "--model", "resnet18", "--no-write", "--cluster"])
            for name, (make, _) in OVER_THE_LIMIT.items()
        }
        read = ["-c", "import sys; from planner.cluster import load_cluster; load_cluster(sys.argv[1])"]
        cases["16,384 nodes of 4 GPUs (at every limit), read"] = (lambda: nodes_of(16_384, 4), read)
        for name, (make, command) in cases.items():
            path = where / "cluster.yaml"
            path.write_text(make())
            code, wall_s, cpu_s, rss_mib = _run([*command, str(path)], where)
            size_kib = path.stat().st_size / 1024
            print(
                f"case={name!r} file_kib={size_kib:.0f} exit={code} wall_s={wall_s:.2f} cpu_s={cpu_s:.2f} "
                f"max_rss_mib={rss_mib:.0f}",
                flush=True,
            )
        if options.plan_at_limit:
            path = where / "cluster.yaml"
            path.write_text(nodes_of(16_384, 4))
            code, wall_s, cpu_s, rss_mib = _run(
                [
                    *cli,
                    "plan",
                    "--no-ray",
                    "--cluster",
                    str(path),
                    *TINY_MODEL,
                    "--no-cache",
                    "--json",
                    "-o",
                    str(where / "plan.json"),
                ],
                where,
            )
            print(
                f"case='plan 16,384 nodes × 4 GPUs' exit={code} wall_s={wall_s:.1f} cpu_s={cpu_s:.1f} "
                f"max_rss_mib={rss_mib:.0f}"
            )


if __name__ == "__main__":
    main()
