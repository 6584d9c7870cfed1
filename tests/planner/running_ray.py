"""A Ray cluster that is "already running" when batchplan starts, as after a user's ``ray start --head``.

Run as a script (``python -m tests.planner.running_ray``) in its own process: it starts a one-raylet cluster
on 127.0.0.1 (dashboard off, one CPU, no GPU), records its address where ``ray start`` does
(``$TMPDIR/ray/ray_current_cluster``; a test gives the process a private ``TMPDIR`` so that no other Ray on
the machine is disturbed), prints one JSON line ``{"address", "node_id"}`` and keeps the cluster up until its
stdin closes, then shuts it down. :class:`RunningRay` is the test-side handle: it starts the process, reads
the line and stops the cluster by closing stdin (never ``ray stop``, which would stop every Ray here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: seconds the cluster may take to come up on a loaded 2-core machine
START_TIMEOUT_S = 120.0


def _serve() -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private.utils import write_ray_address
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "node_ip_address": "127.0.0.1",
            "num_cpus": 1,
            "num_gpus": 0,
            "object_store_memory": 80 * 2**20,
            "include_dashboard": False,
        },
    )
    write_ray_address(cluster.address)  # where `ray start --head` leaves it (under this process's TMPDIR)
    ray.init(
        address=cluster.address, _node_ip_address="127.0.0.1", logging_level="ERROR", log_to_driver=False
    )
    node_id = ray.get_runtime_context().get_node_id()
    ray.shutdown()
    sys.stdout.write(json.dumps({"address": cluster.address, "node_id": node_id}) + "\n")
    sys.stdout.flush()
    try:
        sys.stdin.read()  # until the test closes our stdin
    finally:
        cluster.shutdown()


class RunningRay:
    """Start the cluster in a child process with a private ``TMPDIR``; ``stop()`` shuts it down."""

    def __init__(self) -> None:
        # short: Ray's socket paths under TMPDIR must stay below the 107-character AF_UNIX limit
        self.tmpdir = tempfile.mkdtemp(prefix="bpray", dir="/tmp")
        env = dict(os.environ)
        env.update(self.env())
        env.pop("RAY_ADDRESS", None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.planner.running_ray"],
            cwd=REPO_ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError("the already-running Ray cluster did not start")
        info = json.loads(line)
        self.address: str = info["address"]
        self.node_id: str = info["node_id"]

    @property
    def address_file(self) -> Path:
        return Path(self.tmpdir) / "ray" / "ray_current_cluster"

    def env(self) -> dict[str, str]:
        """Environment for a batchplan subprocess that should find this cluster as a user's would: Ray looks
        for the address file under ``RAY_TMPDIR``, else ``TMPDIR``; both are this cluster's (a user's own
        ``RAY_TMPDIR`` would otherwise win)."""
        return {"TMPDIR": self.tmpdir, "RAY_TMPDIR": self.tmpdir}

    def stop(self) -> None:
        import shutil

        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


if __name__ == "__main__":
    _serve()
