"""Documents written by the last release (commit 173e00e, ``tests/fixtures/release_173e00e/make.py``) still read:
every plan loads, reads back rank by rank, and is written again byte for byte as it was (with its index); every
cache entry it left (profiles, a measured-in-job profile, a gradient layout, a measured network, a measured
synchronisation) is found and trusted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.codec import encode
from planner.plan.io import load_plan
from planner.plan.layout import plan_text
from planner.runtime import load_rank_plan

RELEASE = Path(__file__).resolve().parents[1] / "fixtures" / "release_173e00e"
PLANS = sorted((RELEASE / "plans").glob("*.json"))


def test_the_release_wrote_a_plan_of_every_kind() -> None:
    assert [p.stem for p in PLANS] == ["autobatch", "demo-mixed", "one-gpu", "rebalanced", "shared-node"]


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_a_released_plan_loads_and_is_written_again_byte_for_byte(path: Path) -> None:
    plan = load_plan(path)
    text, index = plan_text(encode(plan))
    assert text == path.read_text()
    assert index == Path(f"{path}.index").read_text()


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_every_rank_of_a_released_plan_reads_its_part(path: Path) -> None:
    document = json.loads(path.read_text())
    for entry in document["ranks"]:
        mine = load_rank_plan(path, rank=entry["rank"], env={})
        assert (mine.batch, mine.loss_weight, mine.gpu) == (entry["batch"], entry["loss_weight"], entry["gpu"])
        assert list(mine.batches) == [r["batch"] for r in document["ranks"]]


@pytest.fixture
def release_cache(tmp_path: Path) -> Path:
    """A copy of the release's cache directory (mode 0755: the cache refuses a directory others may write)."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(RELEASE / "cache", cache)
    cache.chmod(0o755)
    return cache


def test_every_profile_entry_of_the_release_is_trusted(release_cache: Path) -> None:
    from planner.profiles.cache import ProfileCache

    cache = ProfileCache(release_cache)
    entries = sorted(release_cache.glob("*.json"))
    methods = sorted(cache.get(p.stem).method for p in entries)
    assert not cache.problems
    assert methods == ["estimate"] * (len(entries) - 1) + ["job"]


def test_the_release_gradient_layout_network_and_synchronisation_are_found(release_cache: Path) -> None:
    from planner.probing.link_probe import cached_network
    from planner.profiles.measured_sync import find_job_sync
    from planner.profiling.gradients import _read as read_layout

    [layout] = (release_cache / "gradients").glob("*.json")
    assert read_layout(layout) == (3456, 128, 128, 128, 73728, 256, 256, 256, 2560, 40)
    network = cached_network(release_cache, ["node-a", "node-b", "node-c", "node-d"])
    assert network is not None and network.bus_bytes_per_s == pytest.approx(1.8e9, rel=0.01)
    [sync] = (release_cache / "sync").glob("*.json")
    inputs = json.loads(sync.read_text())["inputs"]
    found, problems = find_job_sync(release_cache, inputs)
    assert not problems
    [(shape, measured)] = found.items()
    assert shape.startswith("node-ax2;") and measured.slowdown > 1
