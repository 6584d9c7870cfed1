"""A hung or stopped rank is ended by the ranks that named it, on whatever node it runs.

When a rank hangs (a deadlock, a stuck driver call) or is stopped (SIGSTOP), the re-balancer's collectives on the
other ranks time out and name it (``planner.runtime.rebalance_faults``); those ranks then stop, and so does the
torchrun of their node. The hung rank's own node does not: its torchrun waits for a worker that never exits (a
static rendezvous has no heartbeat), and a stopped process runs no thread of its own. On two nodes, the hung rank's
node still ran 240 s after the other had ended.

So every rank of a re-balanced job starts a small watchdog process beside it (:func:`start_rank_watchdog`: the
standard library only, run isolated with ``python -I``, about 10 MiB), which listens on the address this rank uses
to reach the job's master and files that address, with a random token, in the job's key-value store. A rank that
names another as dead (:func:`stop_ranks`) reads its watchdog's address from the store and sends the token; the
watchdog kills its rank with SIGKILL (which ends a stopped process too), so that rank's torchrun sees a worker
fail and stops its node at once. A watchdog without its token's message does nothing, and it ends with its rank.

Known limitations: the watchdog's port must be reachable from the other nodes, as the process group's own ports
are; where it is not (a firewall that lets through only the master port) the hung rank's node ends when its
torchrun is stopped, as before.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["RankWatchdog", "start_rank_watchdog", "stop_ranks"]

#: seconds between the watchdog's checks that its rank is still alive
_POLL_S = 1.0
#: seconds a sender waits to connect and send (a node that cannot be reached must not hold the survivors)
SEND_TIMEOUT_S = 3.0


class RankWatchdog:
    """The watchdog process of this rank (ended with :meth:`close`, or on its own when the rank ends)."""

    def __init__(self, process: subprocess.Popen, address: str) -> None:
        self.process = process
        self.address = address
        """``host:port`` it listens on"""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.poll() is None:
                self.process.terminate()
                self.process.wait(timeout=5)


def _local_address(master_addr: str, master_port: int) -> str:
    """The address of this host on the route to the job's master (what the other ranks can reach): 127.0.0.1 for a
    job on one machine's loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, master_port))  # UDP: no packet is sent, the route is chosen
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _key(prefix: str, rank: int) -> str:
    return f"{prefix}/watchdog/{rank}"


def start_rank_watchdog(store: Any, prefix: str, rank: int) -> RankWatchdog | None:
    """Start this rank's watchdog and file its address and token under ``prefix`` in ``store``; None where there is
    no store or it cannot start (the job runs on as before, said in the log)."""
    import logging

    log = logging.getLogger(__name__)
    if store is None:
        return None
    host = _local_address(
        os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    )
    token = secrets.token_hex(16)
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), host, token],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C for the job reaches the ranks, not this watchdog: it ends with them
        )
        port = process.stdout.readline().strip()  # type: ignore[union-attr]
        if not port.isdigit():
            process.kill()
            raise OSError(f"it printed {port!r}")
        store.set(_key(prefix, rank), f"{host} {int(port)} {token}")
    except Exception as exc:  # the job runs without it: a hung rank's node then ends only with its torchrun
        log.warning(
            "rank %d: the watchdog that lets other ranks end this one if it hangs did not start (%s)",
            rank,
            exc,
        )
        return None
    return RankWatchdog(process, f"{host}:{int(port)}")


def stop_ranks(store: Any, prefix: str, ranks: list[int]) -> list[int]:
    """Ask the watchdogs of ``ranks`` to kill their rank; the ranks whose watchdog took the message."""
    stopped = []
    for rank in ranks:
        with contextlib.suppress(Exception):  # no watchdog filed, unreachable, or already gone
            host, port, token = store.get(_key(prefix, rank)).decode().split()
            with socket.create_connection((host, int(port)), timeout=SEND_TIMEOUT_S) as conn:
                conn.sendall(token.encode() + b"\n")
                if conn.recv(8) == b"ok\n":
                    stopped.append(rank)
    return stopped


# ------------------------------------------------------------------------------ the watchdog process itself


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    rank_pid, host, token = int(argv[0]), argv[1], argv[2].encode()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.create_server((host, 0))
    listener.settimeout(0)
    sys.stdout.write(f"{listener.getsockname()[1]}\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while _alive(rank_pid) and os.getppid() == rank_pid:
        for _ in selector.select(timeout=_POLL_S):
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(SEND_TIMEOUT_S)
                    received = b""
                    deadline = time.monotonic() + SEND_TIMEOUT_S
                    while (
                        not received.endswith(b"\n") and len(received) < 256 and time.monotonic() < deadline
                    ):
                        chunk = conn.recv(256)
                        if not chunk:
                            break
                        received += chunk
                    if secrets.compare_digest(received.strip(), token):
                        os.kill(rank_pid, signal.SIGKILL)
                        conn.sendall(b"ok\n")
                        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
