"""A rank's watchdog (``planner/runtime/rank_watchdog.py``; issue #34): a rank that names another as dead ends it
through its watchdog, which kills it even when it is stopped (SIGSTOP), and nothing else does. The "rank" here is a
small process that starts its watchdog and stops itself; the store is an in-memory stand-in (the re-balancer uses
the job's own, ``tests/planner/test_example_train_ddp_rebalance.py`` runs it across two torchrun nodes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from planner.runtime.rank_watchdog import stop_ranks
from tests.planner.cli_helpers import REPO_ROOT, cli_env

RANK = """
import json, os, signal, sys
from planner.runtime.rank_watchdog import start_rank_watchdog

class Store(dict):
    def set(self, key, value):
        self[key] = value.encode()

store = Store()
watchdog = start_rank_watchdog(store, "job", 7)
print(json.dumps({k: v.decode() for k, v in store.items()}), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


class _Store(dict):
    def get(self, key):  # the torch store's get returns bytes
        return self[key].encode()


def _start_rank() -> tuple[subprocess.Popen, _Store]:
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=cli_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}),
    )
    filed = json.loads(rank.stdout.readline())
    assert list(filed) == ["job/watchdog/7"] and filed["job/watchdog/7"].startswith("127.0.0.1 ")
    return rank, _Store(filed)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def test_a_stopped_rank_is_ended_by_its_watchdog_on_the_token() -> None:
    rank, store = _start_rank()
    try:
        deadline = time.monotonic() + 60  # the rank stops itself once its line is out (seconds at any load)
        while _state(rank.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.1)
        host, port, _ = store["job/watchdog/7"].split()
        forged = _Store({"job/watchdog/7": f"{host} {port} {'0' * 32}"})
        assert stop_ranks(forged, "job", [7]) == []  # a wrong token does nothing
        assert rank.poll() is None
        assert stop_ranks(store, "job", [7]) == [7]
        assert rank.wait(timeout=30) == -signal.SIGKILL
        assert stop_ranks(store, "job", [7, 8]) == []  # gone with its rank; no watchdog filed for 8
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
