"""Start torch.distributed ranks for a test: every rank a process, gloo on 127.0.0.1, a deadline, and every
rank's output kept and shown when anything goes wrong.

Two ways in:

- :func:`run_ranks` / :class:`GlooRanks`: ``target(rank, *args)`` in ``world_size`` spawned processes
  (``target`` a module-level function of the test module). Each rank finds the environment torchrun would give
  it (``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``,
  ``GLOO_SOCKET_IFNAME=lo``) and calls ``dist.init_process_group("gloo", ...)`` itself, with the timeout its
  test wants. The rendezvous store is this process's, on a port the OS picked and held from the start (as
  torchrun's agent holds its store: ``TORCHELASTIC_USE_AGENT_STORE``), so no other process can take the port
  between choosing and binding it. A rank's stdout and stderr go to its own log file; ``faulthandler`` is on
  (a rank that crashes leaves its stack there, and one past the deadline is asked for its stacks before it
  is killed). A rank ends with ``os._exit`` after its target returns: no interpreter teardown, where a gloo
  process with a peer already gone can abort (seen about 1 run in 40).
- :func:`torchrun`: a script under ``python -m torch.distributed.run``, as users start training, with the
  rendezvous on a port torchrun's agent picks itself (``--rdzv-endpoint 127.0.0.1:0``), every rank's output
  in its own log file (``--redirects 3``), and the logs in the failure message.

Deadlines are against hangs, never measurements: generous enough for a 2-core machine at load 10 (starting
a process that imports torch takes 10-30 s there).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

#: seconds a set of ranks may take before the test fails (a hang), unless the test says otherwise
DEFAULT_DEADLINE_S = 300.0
#: characters of each rank's output shown in a failure message
OUTPUT_TAIL_CHARS = 4000
#: seconds to wait for the stacks of a rank past its deadline
STACK_DUMP_WAIT_S = 10.0


class RanksFailed(AssertionError):
    """Ranks that did not finish, or finished with a non-zero exit code; the message holds every rank's output."""


class GlooRanks:
    """``world_size`` processes running ``target(rank, *args)``; a context manager that kills what is left on exit.

    Args:
        target: a module-level function (spawned processes import it by module and name).
        args: passed after the rank; picklable.
        world_size: number of ranks.
        log_dir: where each rank's ``rank{N}.log`` goes (a fresh temporary directory by default).
        env: extra environment variables for every rank.
    """

    def __init__(
        self,
        target: Callable[..., object],
        *args: object,
        world_size: int,
        log_dir: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        from torch.distributed import TCPStore

        self.world_size = world_size
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="gloo-ranks-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # the rendezvous store, bound to a port the OS picks, held by this process until close()
        self._store = TCPStore(
            "127.0.0.1", 0, None, True, timedelta(seconds=DEFAULT_DEADLINE_S), wait_for_workers=False
        )
        self.port = self._store.port
        context = multiprocessing.get_context("spawn")
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._final_exitcodes: list[int | None] | None = None  # kept when close() releases the processes
        try:
            for rank in range(world_size):
                # the target by name: the rank imports it after its output and faulthandler are set up, so an
                # import that fails or hangs shows in its log too
                process = context.Process(
                    target=_rank_main,
                    name=f"rank{rank}",
                    args=(
                        (target.__module__, target.__qualname__),
                        rank,
                        world_size,
                        self.port,
                        str(self.log_path(rank)),
                        args,
                        dict(env or {}),
                    ),
                )
                process.start()
                self.processes.append(process)
        except BaseException:
            self.close()
            raise

    def log_path(self, rank: int) -> Path:
        return self.log_dir / f"rank{rank}.log"

    def output(self, rank: int) -> str:
        """What rank ``rank`` wrote on stdout and stderr so far."""
        try:
            return self.log_path(rank).read_text(errors="backslashreplace")
        except FileNotFoundError:
            return ""

    @property
    def exitcodes(self) -> list[int | None]:
        """Each rank's exit code (negative: killed by that signal), None while it runs."""
        if self._final_exitcodes is not None:
            return list(self._final_exitcodes)
        return [p.exitcode for p in self.processes]

    def wait(self, deadline_s: float = DEFAULT_DEADLINE_S, ranks: Iterable[int] | None = None) -> None:
        """Wait for ``ranks`` (all by default) to end; past ``deadline_s``, dump the stacks of those still running
        into their logs and raise :class:`RanksFailed` with every rank's output."""
        waiting = list(range(self.world_size)) if ranks is None else list(ranks)
        end = time.monotonic() + deadline_s
        for rank in waiting:
            self.processes[rank].join(timeout=max(0.0, end - time.monotonic()))
        late = [r for r in waiting if self.processes[r].exitcode is None]
        if late:
            self._dump_stacks(late)
            raise RanksFailed(f"rank(s) {late} still running after {deadline_s:.0f} s\n{self.describe()}")

    def check(self, expected: Mapping[int, int] | None = None) -> None:
        """Every rank ended with exit code 0 (or, for a rank in ``expected``, with that code; negative for a
        signal); else :class:`RanksFailed` with every rank's output."""
        wanted = {r: (expected or {}).get(r, 0) for r in range(self.world_size)}
        if any(self.exitcodes[r] != code for r, code in wanted.items()):
            raise RanksFailed(
                f"exit codes {self.exitcodes}, expected {list(wanted.values())}\n{self.describe()}"
            )

    def kill(self, rank: int) -> None:
        """SIGKILL one rank (a stopped one too) and reap it."""
        if self._final_exitcodes is not None:
            return
        process = self.processes[rank]
        if process.exitcode is None:
            process.kill()
        process.join(timeout=30)

    def describe(self) -> str:
        """Every rank's exit code and the end of its output (the text of a failure message)."""
        parts = []
        for rank, code in enumerate(self.exitcodes):
            text = self.output(rank)
            if len(text) > OUTPUT_TAIL_CHARS:
                text = "...\n" + text[-OUTPUT_TAIL_CHARS:]
            parts.append(f"--- rank {rank} (exit {code}, log {self.log_path(rank)})\n{text}")
        return "\n".join(parts)

    def _dump_stacks(self, ranks: Sequence[int]) -> None:
        """Ask each rank for its threads' stacks (faulthandler, in its log) and wait for them to be written."""
        lengths = {rank: len(self.output(rank)) for rank in ranks}
        for rank in ranks:
            pid = self.processes[rank].pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)  # faulthandler.register in _rank_main: all threads' stacks
        end = time.monotonic() + STACK_DUMP_WAIT_S  # a process at load 10 waits a while for a core
        while time.monotonic() < end and any(
            "most recent call first" not in self.output(rank)[lengths[rank] :] for rank in ranks
        ):
            time.sleep(0.1)

    def close(self) -> None:
        """Kill every rank still running and release the store."""
        if self._final_exitcodes is not None:
            return
        for rank in range(len(self.processes)):
            self.kill(rank)
        self._final_exitcodes = [p.exitcode for p in self.processes]
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.close()
        self._store = None

    def __enter__(self) -> GlooRanks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_ranks(
    target: Callable[..., object],
    *args: object,
    world_size: int,
    deadline_s: float = DEFAULT_DEADLINE_S,
    log_dir: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Run ``target(rank, *args)`` on ``world_size`` gloo ranks until all end; every rank must exit 0.

    Returns each rank's output. Raises :class:`RanksFailed`, with every rank's output, on a non-zero exit or
    a rank still running after ``deadline_s``.
    """
    with GlooRanks(target, *args, world_size=world_size, log_dir=log_dir, env=env) as ranks:
        ranks.wait(deadline_s)
        ranks.check()
        return [ranks.output(r) for r in range(world_size)]


def _rank_main(
    target: tuple[str, str],
    rank: int,
    world_size: int,
    port: int,
    log_path: str,
    args: tuple,
    env: dict[str, str],
) -> None:
    """A spawned rank: output to its log, torchrun's environment, ``target(rank, *args)``, ``os._exit``."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=True)
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GLOO_SOCKET_IFNAME="lo",
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
        OMP_NUM_THREADS="1",
    )
    os.environ.update(env)
    code = 0
    try:
        import torch

        torch.set_num_threads(1)  # ranks share two cores: one thread each
        module, qualname = target
        function = importlib.import_module(module)
        for name in qualname.split("."):
            function = getattr(function, name)
        function(rank, *args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# ------------------------------------------------------------------------------------------------ torchrun


def torchrun_command(
    script: str | os.PathLike, *args: str | os.PathLike, nproc: int, log_dir: str | os.PathLike | None = None
) -> list[str]:
    """``python -m torch.distributed.run`` for ``nproc`` ranks on this machine, on 127.0.0.1: the rendezvous on
    a port the agent picks and holds (``--rdzv-endpoint 127.0.0.1:0``, where ``--master-port`` would be a port
    chosen free earlier and bound later), and with ``log_dir`` each rank's stdout and stderr in its own file
    there (``--redirects 3``: lines of several ranks sharing one pipe can interleave); without, the ranks write
    to torchrun's own stdout and stderr."""
    logs = ["--log-dir", str(log_dir), "--redirects", "3"] if log_dir is not None else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "--local-addr",
        "127.0.0.1",
        *logs,
        str(script),
        *(str(a) for a in args),
    ]


def torchrun_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's rank variables, gloo on loopback, one thread a rank, no GPU."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
    }
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def rank_logs(log_dir: str | os.PathLike, name: str = "stdout.log") -> str:
    """Every rank's ``stdout.log`` (or ``stderr.log``) under a torchrun ``--log-dir``, in rank order."""
    return "".join(p.read_text(errors="backslashreplace") for p in sorted(Path(log_dir).rglob(name)))


def describe_torchrun(
    result: subprocess.CompletedProcess[str], log_dir: str | os.PathLike | None = None
) -> str:
    """A torchrun run's exit code, its own output and (with ``log_dir``) every rank's log, for a failure message."""
    logs = sorted(Path(log_dir).rglob("*.log")) if log_dir is not None else []
    ranks = "\n".join(
        f"--- {p.relative_to(log_dir)}\n{p.read_text(errors='backslashreplace')[-OUTPUT_TAIL_CHARS:]}"
        for p in logs
    )
    return (
        f"torchrun exit {result.returncode}\n--- torchrun stdout\n{result.stdout[-OUTPUT_TAIL_CHARS:]}\n"
        f"--- torchrun stderr\n{result.stderr[-OUTPUT_TAIL_CHARS:]}\n{ranks}"
    )


def torchrun(
    script: str | os.PathLike,
    *args: str | os.PathLike,
    nproc: int,
    cwd: str | os.PathLike,
    log_dir: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> subprocess.CompletedProcess[str]:
    """Run ``script ARGS`` under torchrun (:func:`torchrun_command`) until it ends; past ``deadline_s`` it is killed
    and :class:`RanksFailed` names it with every rank's output."""
    command = torchrun_command(script, *args, nproc=nproc, log_dir=log_dir)
    # its own session: past the deadline the launcher and every rank it started are killed together
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=dict(env) if env is not None else torchrun_env(),
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        done = subprocess.CompletedProcess(command, process.returncode, out, err)
        raise RanksFailed(
            f"torchrun still running after {deadline_s:.0f} s\n{describe_torchrun(done, log_dir)}"
        ) from None
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, out, err)
