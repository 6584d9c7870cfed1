"""The re-balancer's measured-speed simulation, run as the README runs it: ``examples/train_ddp.py --rebalance
--simulate-speed K0,K1,K2`` under torchrun, without ``--simulate-sample-ms`` (the per-sample time is measured
after the warm-up and agreed by all ranks). Does each run end at least as good as it started, with the batches
ordered by speed?

Usage: ``python bench/bench_rebalance_measured.py [--runs 5] [--cases NAME,...]``.

Every run is judged on its batches, not on a measured time: under the simulation every rank's compute is
``k_i × s × b_i`` with one agreed ``s``, so a split's simulated step is ``max_i k_i · b_i`` (in units of ``s``).
Cases (global batch 48, the README lab plan's split [3, 11, 34] or the one a ResNet-18 at 32 px gets, [1, 1, 46]):

- ``readme_421``: speeds 4,2,1 from [3, 11, 34], 30 steps (README's command without ``--simulate-sample-ms``);
- ``readme_124``: speeds 1,2,4 from [3, 11, 34], 40 steps;
- ``skewed_124``: speeds 1,2,4 from [1, 1, 46], 40 steps (issue 33's second case).

One line per run: the load average when it started, the batches first and last, the simulated step first and
last, what the re-balancer judged (``step_compute_s``: the median slowest compute of the first and last split),
the max idle it reports, whether the batches end ordered by speed (a rank 2× faster or more takes more) and the
switches; then one summary line per case. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.net import free_port  # noqa: E402  (the repository on the path first, for a plain `python bench/...`)
from tests.plans import make_plan  # noqa: E402

EXAMPLE = REPO / "examples" / "train_ddp.py"
CASES = {
    "readme_421": ((4.0, 2.0, 1.0), (3, 11, 34), 30),
    "readme_124": ((1.0, 2.0, 4.0), (3, 11, 34), 40),
    "skewed_124": ((1.0, 2.0, 4.0), (1, 1, 46), 40),
}
_FIELDS = re.compile(r"(\w+)=(\[[^\]]*\]|\S+)")


def simulated_step(speeds, batches) -> float:
    return max(k * b for k, b in zip(speeds, batches, strict=True))


def ordered(speeds, batches) -> bool:
    return all(
        batches[i] > batches[j]
        for i, j in itertools.permutations(range(len(speeds)), 2)
        if speeds[j] >= 2 * speeds[i]
    )


def run_once(workdir: Path, speeds, first, steps) -> dict:
    plan = workdir / "plan.json"
    plan.write_text(json.dumps(make_plan(first)))
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"}}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    load = os.getloadavg()[0]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "3",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(EXAMPLE),
            "--plan",
            str(plan),
            "--steps",
            str(steps),
            "--rebalance",
            "--simulate-speed",
            ",".join(f"{k:g}" for k in speeds),
            "--write-plan",
            str(workdir / "trained.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=workdir,
    )
    line = next((x for x in result.stdout.splitlines() if x.startswith("rebalance: switches=")), None)
    if result.returncode != 0 or line is None:
        raise RuntimeError(
            f"the run failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    fields = dict(_FIELDS.findall(line))
    last = tuple(json.loads(fields["batches_last"]))
    return {
        "load": load,
        "first": first,
        "last": last,
        "line": line,
        "step_first": simulated_step(speeds, first),
        "step_last": simulated_step(speeds, last),
        "judged_first": fields["step_compute_s_first"],
        "judged_last": fields["step_compute_s_last"],
        "idle_first": fields["max_idle_first"],
        "idle_last": fields["max_idle_last"],
        "ordered": ordered(speeds, last),
        "switches": int(fields["switches"]),
        "rollbacks": int(fields["rollbacks"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown or args.runs < 1:
        parser.error(f"unknown cases {unknown} (known: {', '.join(CASES)}); --runs >= 1")
    failed = False
    for name in names:
        speeds, first, steps = CASES[name]
        records = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                r = run_once(Path(tmp), speeds, first, steps)
            records.append(r)
            print(
                f"rebalance_measured: case={name} load={r['load']:.1f} batches={list(r['first'])}->{list(r['last'])} "
                f"simulated_step={r['step_first']:g}->{r['step_last']:g} step_compute_s={r['judged_first']}->"
                f"{r['judged_last']} max_idle={r['idle_first']}->{r['idle_last']} ordered={r['ordered']} "
                f"switches={r['switches']} rollbacks={r['rollbacks']}",
                flush=True,
            )
        as_good = sum(r["step_last"] <= r["step_first"] for r in records)
        in_order = sum(r["ordered"] for r in records)
        loads = [r["load"] for r in records]
        failed |= as_good < len(records) or in_order < len(records)
        print(
            f"rebalance_measured: case={name} runs={len(records)} load={min(loads):.1f}-{max(loads):.1f} "
            f"as_good_as_start={as_good}/{len(records)} ordered_by_speed={in_order}/{len(records)}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
