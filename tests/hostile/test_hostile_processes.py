"""What a dying probe, a signal or a user module can do to a planning run (each test starts its own
``batchplan`` subprocess, which starts its own local Ray cluster on 127.0.0.1):

- a probe killed mid-profile: ``--json`` output stays exactly one JSON document (Ray's ``(raylet) A worker
  died ...`` goes to stderr, if anywhere): the plan of the nodes left, or, when the killed probe was the only
  one, the ``batchplan/error@1`` document of the run's one ``error:`` line (preflight: its no-go result);
- SIGTERM: handled like Ctrl-C (one ``error:`` line, no traceback or C++ stack dump, everything started
  stopped, exit 128 + 15);
- SIGKILL of the driver: the Ray processes it started exit on their own (the watchdog);
- a user factory: the working directory is searched after the standard library (a ``json.py`` there
  replaces nothing), and one stderr line says which module is imported and run.

Ray processes are recognised by the ``RAY_TMPDIR`` each test gives its run (a fresh directory), never by
name; any left behind are killed by pid at the end of the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.planner.cli_helpers import assert_error_document, assert_ok, cli_env, describe, parse_json_stdout

pytestmark = [pytest.mark.slow, pytest.mark.ray]

#: seconds for a run to reach its hanging probe (Ray start, probes, the driver's model build)
START_TIMEOUT_S = 150.0
#: seconds the Ray processes of a dead driver may take to exit on their own
ORPHAN_TIMEOUT_S = 60.0

ONE_NODE = """name: one
nodes:
  - {name: n-a, gpus: [{type: T4, count: 1}]}
"""

THREE_NODES = """name: three
nodes:
  - {name: n-a, gpus: [{type: T4, count: 1}]}
  - {name: n-b, gpus: [{type: T4, count: 1}]}
  - {name: n-c, gpus: [{type: T4, count: 1}]}
"""

#: a user module: the first probe to build its model records its pid and hangs; every import of it records
#: the import path it was imported under
USER_MODULE = """
import json as _json, os, sys, time
from pathlib import Path
from tests.planner.tiny_models import convnet

MARKS = Path(os.environ["HOSTILE_MARKS"])
with open(MARKS / "imports.jsonl", "a") as _handle:
    _handle.write(_json.dumps({"pid": os.getpid(), "sys_path": sys.path}) + "\\n")


def _in_probe():
    import ray
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def hang_once():
    if os.environ.get("HOSTILE_HANG") and _in_probe():
        try:
            fd = os.open(MARKS / "hung.pid", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return convnet()
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        time.sleep(3600)
    return convnet()
"""

#: a json.py in the working directory: if a process ever imports it instead of the standard library's, it says so
SHADOW_JSON = """
import os
open(os.path.join(os.environ["HOSTILE_MARKS"], "SHADOWED-" + str(os.getpid())), "w").close()
from importlib import import_module as _im
raise ImportError("the json.py of the working directory was imported instead of the standard library")
"""

MODEL = ("--model", "usermod:hang_once", "--input-shape", "3,32,32")


class Run:
    """A ``batchplan`` subprocess with its own Ray temp dir, its working directory and its marks."""

    def __init__(self, tmp_path: Path, *args: str, hang: bool, shadow_json: bool) -> None:
        self.cwd = tmp_path / "work"
        self.marks = tmp_path / "marks"
        self.cwd.mkdir()
        self.marks.mkdir()
        (self.cwd / "three.yaml").write_text(THREE_NODES)
        (self.cwd / "one.yaml").write_text(ONE_NODE)
        (self.cwd / "usermod.py").write_text(USER_MODULE)
        if shadow_json:
            (self.cwd / "json.py").write_text(SHADOW_JSON)
        # Ray puts unix sockets under its temp dir: keep the path short (107-byte limit)
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="bph-", dir="/tmp"))
        env = {"RAY_TMPDIR": str(self.ray_tmp), "HOSTILE_MARKS": str(self.marks)}
        if hang:
            env["HOSTILE_HANG"] = "1"
        # the console script, as a user runs it: `python -m` would put the working directory first on sys.path
        # itself, whatever batchplan does
        script = shutil.which("batchplan", path=str(Path(sys.executable).parent)) or shutil.which("batchplan")
        assert script is not None, "the batchplan console script is not installed (pip install -e .)"
        self.proc = subprocess.Popen(
            [script, *args],
            cwd=self.cwd,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_for_hung_probe(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        mark = self.marks / "hung.pid"
        while time.monotonic() < deadline:
            if mark.exists() and mark.read_text():
                return int(mark.read_text())
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.proc.kill()
        out, err = self.proc.communicate()
        raise AssertionError(
            f"no probe hung (exit {self.proc.returncode})\n--- stdout\n{out}\n--- stderr\n{err}"
        )

    def finish(self, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
        out, err = self.proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def ray_processes(self) -> list[psutil.Process]:
        """Live processes started for this run: they carry its RAY_TMPDIR in their environment or command line."""
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid == os.getpid():
                    continue
                ours = str(self.ray_tmp) in " ".join(proc.info["cmdline"] or ()) or proc.environ().get(
                    "RAY_TMPDIR"
                ) == str(self.ray_tmp)
                if ours and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def wait_until_no_ray_processes(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            left = self.ray_processes()
            if not left:
                return []
            time.sleep(1.0)
        return [" ".join(p.cmdline())[:120] for p in left if p.is_running()]

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for proc in self.ray_processes():  # what this run started and did not stop: by pid, never `ray stop`
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture
def runs(tmp_path) -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.cleanup()


def _start(runs: list[Run], tmp_path: Path, *args: str, hang: bool = True, shadow_json: bool = False) -> Run:
    run = Run(tmp_path, *args, hang=hang, shadow_json=shadow_json)
    runs.append(run)
    return run


@pytest.mark.parametrize("command", ["plan", "preflight"])
def test_json_stdout_survives_a_probe_killed_mid_profile(runs, tmp_path, command) -> None:
    extra = ("--no-write",) if command == "plan" else ()
    # one raylet per node (--raylet-cap 3): with the default single raylet the killed probe answers for all
    run = _start(
        runs,
        tmp_path,
        command,
        "--cluster",
        "three.yaml",
        *MODEL,
        "--no-cache",
        "--json",
        "--raylet-cap",
        "3",
        *extra,
    )
    os.kill(run.wait_for_hung_probe(), signal.SIGKILL)
    result = run.finish()
    assert result.returncode in (0, 1), describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    doc = parse_json_stdout(result)
    plan = doc if command == "plan" else doc["plan"]
    assert (
        len({r["node"] for r in plan["ranks"]}) == 2
    )  # the killed probe's node is left out, the rest planned
    assert "(raylet)" not in result.stdout and "\x1b[" not in result.stdout


@pytest.mark.parametrize("command", ["plan", "preflight"])
def test_json_stdout_is_a_document_when_the_only_probe_is_killed_mid_profile(runs, tmp_path, command) -> None:
    extra = ("--no-write",) if command == "plan" else ()
    run = _start(runs, tmp_path, command, "--cluster", "one.yaml", *MODEL, "--no-cache", "--json", *extra)
    os.kill(run.wait_for_hung_probe(), signal.SIGKILL)
    result = run.finish()
    assert result.returncode == 1, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert "(raylet)" not in result.stdout and "\x1b[" not in result.stdout
    if command == "plan":  # nothing left to plan on: the error, as a document and as the last stderr line
        [line] = _error_lines(result.stderr)
        assert result.stderr.strip().splitlines()[-1] == line, describe(result)
        doc = assert_error_document(result, 1, line)
        assert doc["command"] == "plan" and "n-a" in doc["error"], doc
    else:  # preflight's own result: no-go, the failed check naming the killed probe's node
        doc = parse_json_stdout(result)
        assert doc["ok"] is False and doc["plan"] is None, doc
        assert any(not c["ok"] and "n-a" in c["detail"] for c in doc["checks"]), doc["checks"]
    assert run.wait_until_no_ray_processes(ORPHAN_TIMEOUT_S) == []


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_sigterm_is_handled_like_ctrl_c(runs, tmp_path) -> None:
    run = _start(runs, tmp_path, "plan", "--cluster", "three.yaml", *MODEL, "--no-cache", "--no-write")
    run.wait_for_hung_probe()
    run.proc.send_signal(signal.SIGTERM)
    result = run.finish(timeout_s=90)
    assert result.returncode == 128 + signal.SIGTERM, describe(result)
    assert result.stdout == "", describe(result)
    assert "Traceback" not in result.stderr and "*** SIG" not in result.stderr, describe(result)
    assert " @ " not in result.stderr and "0x" not in result.stderr, describe(result)  # no C++ stack dump
    assert _error_lines(result.stderr) == [result.stderr.strip().splitlines()[-1]], describe(result)
    assert "terminated" in _error_lines(result.stderr)[0]
    assert run.wait_until_no_ray_processes(ORPHAN_TIMEOUT_S) == []


def test_ctrl_c_gives_one_line_and_stops_everything(runs, tmp_path) -> None:
    run = _start(runs, tmp_path, "plan", "--cluster", "three.yaml", *MODEL, "--no-cache", "--no-write")
    run.wait_for_hung_probe()
    run.proc.send_signal(signal.SIGINT)
    result = run.finish(timeout_s=90)
    assert result.returncode == 128 + signal.SIGINT, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert len(_error_lines(result.stderr)) == 1, describe(result)
    assert run.wait_until_no_ray_processes(ORPHAN_TIMEOUT_S) == []


def test_a_killed_driver_leaves_no_ray_process_behind(runs, tmp_path) -> None:
    run = _start(runs, tmp_path, "plan", "--cluster", "three.yaml", *MODEL, "--no-cache", "--no-write")
    run.wait_for_hung_probe()
    assert run.ray_processes(), "the run's Ray processes are not recognisable by its RAY_TMPDIR"
    run.proc.kill()  # SIGKILL: no handler runs, no finally block
    run.proc.communicate()
    assert run.wait_until_no_ray_processes(ORPHAN_TIMEOUT_S) == []


@pytest.mark.parametrize("command", ["plan", "preflight"])
def test_user_code_is_searched_after_the_standard_library_and_announced(runs, tmp_path, command) -> None:
    extra = ("--no-write",) if command == "plan" else ()
    run = _start(
        runs,
        tmp_path,
        command,
        "--cluster",
        "three.yaml",
        *MODEL,
        "--no-cache",
        "--json",
        *extra,
        hang=False,
        shadow_json=True,
    )
    result = run.finish()
    assert_ok(result, 0 if command == "plan" else result.returncode)
    doc = parse_json_stdout(result)
    assert not list(run.marks.glob("SHADOWED-*")), (
        "a json.py in the working directory replaced the standard library"
    )
    imports = [json.loads(line) for line in (run.marks / "imports.jsonl").read_text().splitlines()]
    assert len({i["pid"] for i in imports}) >= 2  # the driver and at least one probe imported the user module
    stdlib = os.path.dirname(os.__file__)
    for record in imports:
        path = record["sys_path"]
        cwd_index = min(i for i, p in enumerate(path) if p in (str(run.cwd), "", "."))
        assert cwd_index > path.index(stdlib), path
    announced = [line for line in result.stderr.splitlines() if "usermod" in line]
    assert len(announced) == 1, result.stderr
    assert "import" in announced[0] and str(run.cwd / "usermod.py") in announced[0]
    if command == "preflight":
        assert any("usermod" in check["detail"] for check in doc["checks"])
