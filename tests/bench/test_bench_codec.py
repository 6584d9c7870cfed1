"""bench/bench_codec.py: its plan builder and every reader it times read the same plan (the comparison compares
like with like), and pydantic's tweaked types keep what our codec reads."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_codec.py"


@pytest.fixture(scope="module")
def bench_codec():
    spec = importlib.util.spec_from_file_location("bench_codec", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_codec"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["bench_codec"]


@pytest.fixture(scope="module")
def plan_bytes(bench_codec, tmp_path_factory) -> bytes:
    return bench_codec.write_plan_file(24, tmp_path_factory.mktemp("codec") / "plan.json").read_bytes()


def test_codec_readers_agree(bench_codec, plan_bytes):
    plan = bench_codec.reader("plan_from_bytes")[0](plan_bytes)
    fields = bench_codec.reader("codec_decode")[0](plan_bytes)
    assert plan.world_size == 24 and len(plan.nodes) == 3
    assert fields.pop("extra", {}) == plan.extra == {}  # no newer writer's keys
    assert fields == {
        f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in ("advice", "extra")
    }


@pytest.mark.parametrize("name", ["pydantic_plan", "pydantic_decode"])
def test_pydantic_reads_the_same_plan(bench_codec, plan_bytes, name):
    pytest.importorskip("pydantic")
    plan = bench_codec.reader("plan_from_bytes")[0](plan_bytes)
    read, setup_s = bench_codec.reader(name)
    got = read(plan_bytes)
    assert setup_s > 0
    assert dataclasses.asdict(got) == dataclasses.asdict(
        plan
    )  # every field; the profiles' classes are pydantic's
    assert {key: type(profile.memory_fit) for key, profile in got.profiles.items()} == {
        key: type(profile.memory_fit) for key, profile in plan.profiles.items()
    }


def test_pydantic_plan_checks_the_identities(bench_codec, plan_bytes):
    pytest.importorskip("pydantic")
    wrong = plan_bytes.replace(b'"accumulate": 1', b'"accumulate": 2', 1)
    with pytest.raises(Exception, match="global_batch"):
        bench_codec.reader("pydantic_plan")[0](wrong)
    assert bench_codec.reader("pydantic_decode")[0](wrong).accumulate == 2
