"""Running SLURM's commands (``sinfo``, ``scontrol``) as a bounded edge: a hang, a flood of output, a failure or
bytes that are not UTF-8 become one ``ConfigError`` with SLURM's words escaped, never a hang or a traceback."""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import time
from collections.abc import Sequence

from planner.errors import ConfigError

#: seconds a SLURM command may take (slurmctld answers in milliseconds; a hung one must not hang us)
SLURM_COMMAND_TIMEOUT_S = 30.0
#: most bytes a SLURM command may print: a cluster config's ``MAX_CONFIG_BYTES`` (16 MiB; ``sinfo`` of 16,384
#: nodes prints about 1 MiB)
MAX_SLURM_OUTPUT_BYTES = 16 * 2**20
#: most bytes of a failing command's stderr kept for its error line
_MAX_STDERR_BYTES = 2**16


def run_slurm_command(argv: Sequence[str]) -> str:
    """stdout of a SLURM command; a missing command, a failure, a hang or an answer over
    :data:`MAX_SLURM_OUTPUT_BYTES` is one ConfigError with SLURM's words (escaped). Bytes that are not UTF-8 are
    read as U+FFFD: a field batchplan uses is then refused by its own check (a node name, a GRES), naming it."""
    shown = " ".join(argv)
    if shutil.which(argv[0]) is None:
        raise ConfigError(
            f"{argv[0]} is not on PATH (run on a SLURM login or compute node, or load its module)"
        )
    returncode, out, err = _bounded_run(argv, shown)
    if returncode != 0:
        said = err.decode("utf-8", "replace").strip() or out.decode("utf-8", "replace").strip()
        last = said.splitlines()[-1][:200] if said else f"exit {returncode}"
        raise ConfigError(f"`{shown}` failed: {last!r} (check that slurmctld is reachable: `scontrol ping`)")
    return out.decode("utf-8", "replace")


def _bounded_run(argv: Sequence[str], shown: str) -> tuple[int, bytes, bytes]:
    """Run ``argv`` for at most :data:`SLURM_COMMAND_TIMEOUT_S`, reading at most :data:`MAX_SLURM_OUTPUT_BYTES` of
    stdout (the first :data:`_MAX_STDERR_BYTES` of stderr are kept, the rest dropped); the command is killed when
    it goes past either, or when this process is interrupted."""
    try:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise ConfigError(
            f"`{shown}` could not start: {exc.strerror} (check the SLURM installation)"
        ) from None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + SLURM_COMMAND_TIMEOUT_S
    problem = None
    try:
        with selectors.DefaultSelector() as selector:
            assert process.stdout is not None and process.stderr is not None
            selector.register(process.stdout, selectors.EVENT_READ, out)
            selector.register(process.stderr, selectors.EVENT_READ, err)
            while selector.get_map() and problem is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    problem = f"did not answer in {SLURM_COMMAND_TIMEOUT_S:.0f} s (is slurmctld up? `scontrol ping` tells)"
                    break
                for key, _ in selector.select(timeout=left):
                    data = os.read(key.fd, 2**16)
                    if not data:
                        selector.unregister(key.fileobj)
                    elif key.data is err:
                        err.extend(data[: max(0, _MAX_STDERR_BYTES - len(err))])
                    elif len(out) + len(data) > MAX_SLURM_OUTPUT_BYTES:
                        problem = (
                            f"printed over {MAX_SLURM_OUTPUT_BYTES // 2**20} MiB, the most batchplan reads of "
                            "an answer (is this SLURM's command?)"
                        )
                        break
                    else:
                        out.extend(data)
        if problem is None:
            returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        problem = f"did not exit in {SLURM_COMMAND_TIMEOUT_S:.0f} s (is slurmctld up? `scontrol ping` tells)"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
    if problem is not None:
        raise ConfigError(f"`{shown}` {problem}")
    return returncode, bytes(out), bytes(err)
