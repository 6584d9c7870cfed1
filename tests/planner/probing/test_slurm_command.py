"""SLURM's commands as a bounded edge (``planner/probing/slurm_command.py``, issue #34 item 2): an answer that is
not UTF-8, too long, too slow or a failure with escape sequences in it is one ``ConfigError``, never a traceback
or a hang. The commands are small stand-in scripts on ``PATH``; ``tests/planner/cli/test_cli_slurm.py`` runs the
real ones."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from planner.errors import ConfigError
from planner.probing import slurm_command
from planner.probing.slurm import partition_cluster
from planner.probing.slurm_command import run_slurm_command
from tests.planner.cli_helpers import describe, run_cli


def _fake_command(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_a_byte_that_is_not_utf8_is_read_as_a_replacement_character_and_refused_where_used(
    fake_bin: Path,
) -> None:
    _fake_command(fake_bin, "sinfo", r"printf 'gpu\37701|gpu:t4:2|idle|1000|8\n'")
    assert run_slurm_command(["sinfo"]) == "gpu\ufffd01|gpu:t4:2|idle|1000|8\n"
    with pytest.raises(ConfigError, match=r"SLURM lists a node name 'gpu\ufffd01' may hold only"):
        partition_cluster("p")


def test_an_answer_over_the_limit_is_cut_off_and_refused(
    fake_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_command, "MAX_SLURM_OUTPUT_BYTES", 2**20)
    _fake_command(fake_bin, "sinfo", "yes gpu01")  # endless: only the limit stops it
    with pytest.raises(ConfigError, match=r"`sinfo` printed over 1 MiB, the most batchplan reads"):
        run_slurm_command(["sinfo"])


def test_a_command_that_hangs_is_stopped_at_the_timeout(
    fake_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_command, "SLURM_COMMAND_TIMEOUT_S", 1.0)
    _fake_command(fake_bin, "sinfo", "exec sleep 600")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"`sinfo` did not answer in 1 s"):
        run_slurm_command(["sinfo"])
    # the bound is 1 s; 60 s leaves room for a loaded machine while still telling a hang from a timeout
    assert time.monotonic() - started < 60


def test_a_failure_is_one_line_with_slurm_s_words_escaped(fake_bin: Path) -> None:
    _fake_command(
        fake_bin, "sinfo", r"printf 'first\nsinfo: error: \033[31mno\033]0;x\007 partition\n' >&2; exit 1"
    )
    with pytest.raises(ConfigError) as raised:
        run_slurm_command(["sinfo"])
    message = str(raised.value)
    assert "\x1b" not in message and "\x07" not in message and "\n" not in message
    assert r"failed: 'sinfo: error: \x1b[31mno\x1b]0;x\x07 partition'" in message


def test_preflight_of_a_partition_whose_sinfo_prints_a_bad_byte_is_one_error_line(
    fake_bin: Path, tmp_path: Path
) -> None:
    _fake_command(fake_bin, "sinfo", r"printf 'gpu01|gpu:t4:2|idle|1000|8\ngpu02|gpu:\377:2|idle|1000|8\n'")
    result = run_cli(
        "preflight",
        "--slurm-partition",
        "p",
        "--model",
        "resnet18",
        "--json",
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
    )
    assert result.returncode == 2, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: node gpu02: GRES gpu:\ufffd names no GPU type"), describe(result)
