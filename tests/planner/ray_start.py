"""A Ray cluster started the way users start one: ``ray start --head`` and ``ray start --address HEAD``.

Every process runs with a private ``HOME`` (so the token file ``~/.ray/auth_token`` is the test's own) and a
private ``TMPDIR`` (so its address file and session directories touch no other Ray on the machine), on
127.0.0.1, dashboard off, every port picked free. ``ray start --block`` stays in the foreground with the
Ray processes as its children; :meth:`RayStartCluster.stop` stops each ``ray start`` by its PID (SIGTERM:
it stops its own Ray processes), never ``ray stop``, which would stop every Ray here. Run as a module
(``python -m tests.planner.ray_start start ...``) it is ``ray start`` kept on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.net import free_port

#: seconds a head or a worker raylet may take to come up on a loaded 2-core machine
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


REPO_ROOT = Path(__file__).resolve().parents[2]


def _ray_start_on_loopback() -> None:
    """``ray start ARGS`` as the ``ray`` script runs it, except that 127.0.0.1 stays 127.0.0.1: Ray replaces a
    loopback ``--node-ip-address`` and ``--address`` with the host's own address (``resolve_ip_for_localhost``),
    and its only switch against that (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) also refuses a second node.
    Test traffic must stay on 127.0.0.0/8."""
    from ray._private import services

    services.resolve_ip_for_localhost = lambda host: host
    from ray.scripts.scripts import main

    sys.argv = ["ray", *sys.argv[1:]]
    main()


class RayStartCluster:
    """A head and ``num_workers`` more raylets on 127.0.0.1, with Ray's token authentication on or off."""

    def __init__(self, *, auth: bool, num_workers: int = 1) -> None:
        # short: Ray's socket paths under TMPDIR must stay below the 107-character AF_UNIX limit
        self.root = Path(tempfile.mkdtemp(prefix="bprs", dir="/tmp"))
        self.home = self.root / "home"
        (self.home / ".ray").mkdir(parents=True)
        self.auth = auth
        self.token = secrets.token_hex(32) if auth else ""
        if auth:
            (self.home / ".ray" / "auth_token").write_text(self.token)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        try:
            self._start(
                [
                    "--head",
                    "--port",
                    str(self.port),
                    "--include-dashboard",
                    "false",
                    "--dashboard-port",
                    str(free_port()),
                ]
            )
            self._wait_for_nodes(1)
            for _ in range(num_workers):
                self._start(["--address", self.address])
            self._wait_for_nodes(1 + num_workers)
        except BaseException:
            self.stop()
            raise

    def env(self) -> dict[str, str]:
        """What a user's shell on this machine has: the private HOME and TMPDIR (and RAY_TMPDIR, which Ray
        reads first: a user's own would otherwise win), no auth mode set."""
        return {"HOME": str(self.home), "TMPDIR": str(self.root), "RAY_TMPDIR": str(self.root)}

    def _ray_env(self) -> dict[str, str]:
        # not the test session's RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: `ray start --address` refuses a second
        # node under it (127.0.0.1 is kept by _ray_start_on_loopback instead)
        dropped = ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k not in dropped}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.update(
            self.env(), RAY_AUTH_MODE="token" if self.auth else "disabled", RAY_USAGE_STATS_ENABLED="0"
        )
        return env

    def _start(self, role: list[str]) -> None:
        ports = [
            "--node-manager-port",
            "--object-manager-port",
            "--metrics-export-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
        ]
        command = [
            sys.executable,
            "-m",
            "tests.planner.ray_start",
            "start",
            "--block",
            *role,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            "1",
            "--num-gpus",
            "0",
            "--disable-usage-stats",
            "--object-store-memory",
            str(80 * 2**20),
        ]
        for flag in ports:
            command += [flag, str(free_port())]
        log = open(self.root / f"ray-start-{len(self.processes)}.log", "w")  # noqa: SIM115 (closed with the process)
        self.processes.append(
            subprocess.Popen(
                command,
                env=self._ray_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )
        )

    def _wait_for_nodes(self, count: int) -> None:
        """Until ``ray list nodes``-style status shows ``count`` alive nodes (asked with the token)."""
        probe = (
            "import ray, sys; ray.init(address=sys.argv[1], _node_ip_address='127.0.0.1', logging_level='ERROR', log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"`ray start` exited with {process.returncode}: {self.logs()}")
            # a driver keeps 127.0.0.1 under this variable (it starts no node, so the refusal does not apply)
            result = subprocess.run(
                [sys.executable, "-c", probe, self.address],
                env={**self._ray_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
            )
            if result.returncode == 0 and result.stdout.strip().isdigit() and int(result.stdout) >= count:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster did not reach {count} node(s): {self.logs()}")

    def logs(self) -> str:
        return " | ".join(p.read_text()[-2000:] for p in sorted(self.root.glob("ray-start-*.log")))

    def stop(self) -> None:
        """SIGTERM to every ``ray start --block`` (workers first), then SIGKILL to what is left of its group."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            # anything `ray start` left behind is in its own session (start_new_session): stop it by group id
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    _ray_start_on_loopback()
