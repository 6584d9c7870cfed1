"""A real SLURM cluster on this host, on 127.0.0.1: munged, slurmctld and one slurmd per node (``slurmd -N
NAME``, each on its own port), from the distribution's packages (``apt-get install slurmctld slurmd munge``,
which ``.ci/run`` does).

Everything lives under one temporary directory: munge's socket, seed and log, slurm.conf and gres.conf
(GPUs declared as GRES with ``AutoDetect=off`` and one ``File=`` per card: plain files, no driver needed),
the controller's state and each slurmd's spool. Every daemon runs in the foreground (``-F``/``-D``) as a
child of the test and is stopped by its PID. Clients (``sinfo``, ``srun``, ``salloc``, ``scontrol``) find the
cluster through ``SLURM_CONF`` (:meth:`SlurmCluster.env`).

Without the binaries the tests skip, except in CI (``CI=true``), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.net import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "salloc", "scontrol")
MUNGE_KEY = Path("/etc/munge/munge.key")
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SlurmNode:
    name: str
    gres_type: str
    num_gpus: int
    more_gpus: tuple[tuple[str, int], ...] = ()
    """further GRES entries of other types, ``(("a10", 2),)``: a node of several GPU types"""

    @property
    def gres(self) -> tuple[tuple[str, int], ...]:
        """every ``(type, count)`` entry of the node, in gres.conf order"""
        return ((self.gres_type, self.num_gpus), *self.more_gpus)


#: the nodes of the suite's SLURM cluster (the ``slurm`` fixture of tests/conftest.py)
SLURM_TEST_NODES = (SlurmNode("gpu-a", "a100", 2), SlurmNode("gpu-b", "t4", 1))


def require_slurm() -> None:
    """Skip without SLURM's binaries or munge's key, unless in CI, where they must be there."""
    missing = [b for b in BINARIES if shutil.which(b) is None] + (
        [] if MUNGE_KEY.exists() else [str(MUNGE_KEY)]
    )
    if not missing:
        return
    reason = (
        f"SLURM is not installed here ({', '.join(missing)} missing; apt-get install slurmctld slurmd munge)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: .ci/run installs it, so in CI this is a failure")
    pytest.skip(reason)


class SlurmCluster:
    """munged + slurmctld + one slurmd per node, partition ``gpus`` holding them all."""

    def __init__(self, nodes: Sequence[SlurmNode], *, partition: str = "gpus") -> None:
        require_slurm()
        self.root = Path(tempfile.mkdtemp(prefix="bpslurm", dir="/tmp"))
        self.nodes = list(nodes)
        self.partition = partition
        self.host = socket.gethostname().split(".")[0]
        self.processes: list[tuple[str, subprocess.Popen]] = []
        try:
            self._write_config()
            self._start(
                "munged",
                [
                    "munged",
                    "-F",
                    "-f",
                    f"--socket={self.munge_socket}",
                    f"--key-file={MUNGE_KEY}",
                    f"--pid-file={self.root}/munged.pid",
                    f"--seed-file={self.root}/munged.seed",
                    f"--log-file={self.root}/munged.log",
                ],
            )
            self._wait_for(lambda: self.munge_socket.exists(), "munged's socket")
            self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            self._wait_for(lambda: self._run("scontrol", "ping").returncode == 0, "slurmctld")
            for node in self.nodes:
                self._start(f"slurmd-{node.name}", ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)])
            self._wait_for(self._all_idle, "every slurmd to register")
        except BaseException:
            self.stop()
            raise

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge.sock"

    def env(self) -> dict[str, str]:
        """What a user's shell on a node of this cluster has."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        (self.root / "state").mkdir()
        lines = [
            "ClusterName=bptest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool-%n",
            f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log",
            f"SlurmdLogFile={self.root}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
        ]
        gres = ["AutoDetect=off"]
        for node in self.nodes:
            entries = ",".join(f"gpu:{gres_type}:{count}" for gres_type, count in node.gres)
            lines.append(
                f"NodeName={node.name} NodeAddr=127.0.0.1 NodeHostname={self.host} Port={free_port()} "
                f"CPUs=2 RealMemory=4000 Gres={entries} State=UNKNOWN"
            )
            index = 0
            for gres_type, count in node.gres:
                for _ in range(count):
                    card = self.root / f"dev-{node.name}-gpu{index}"
                    card.touch()
                    gres.append(f"NodeName={node.name} Name=gpu Type={gres_type} File={card}")
                    index += 1
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")  # noqa: SIM115 (lives as long as the daemon)
        self.processes.append(
            (
                name,
                subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.root,
                    env={**os.environ, **self.env()},
                ),
            )
        )

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=30, env={**os.environ, **self.env()}
        )

    def _all_idle(self) -> bool:
        result = self._run("sinfo", "-N", "-h", "-o", "%N %t")
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return all(states.get(n.name) == "idle" for n in self.nodes)

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}: {self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")

    def logs(self) -> str:
        return " | ".join(f"{p.name}: {p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.out")))

    def stop(self) -> None:
        """SIGTERM to every daemon by its PID, the last started first; SIGKILL after a grace period."""
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
