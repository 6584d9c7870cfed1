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
        assert (mine.batch, mine.loss_weight, mine.gpu) == (
            entry["batch"],
            entry["loss_weight"],
            entry["gpu"],
        )
        assert list(mine.batches) == [r["batch"] for r in document["ranks"]]


@pytest.fixture
def release_cache(tmp_path: Path) -> Path:
    """A copy of the release's cache directory (mode 0755: the cache refuses a directory others may write)."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(RELEASE / "cache", cache)
    cache.chmod(0o755)
    return cache


def test_every_entry_of_the_release_is_found_and_trusted_through_the_store(release_cache: Path) -> None:
    from planner.obtain.gradients import GRADIENTS
    from planner.probing.link_probe import LINKS
    from planner.profiles.cache import PROFILES
    from planner.profiles.measured_sync import SYNC
    from planner.store import CacheStore

    store = CacheStore(release_cache)
    profiles = [store.read(PROFILES, p.stem) for p in sorted(release_cache.glob("*.json"))]
    assert sorted(p.method for p in profiles) == ["estimate"] * (len(profiles) - 1) + ["job"]
    [layout] = (release_cache / "gradients").glob("*.json")
    assert store.read(GRADIENTS, layout.stem) == (3456, 128, 128, 128, 73728, 256, 256, 256, 2560, 40)
    [network] = (release_cache / "links").glob("*.json")
    link = store.read(LINKS, network.stem)
    assert (
        link is not None and link.name == "network" and link.bus_bytes_per_s == pytest.approx(1.8e9, rel=0.01)
    )
    [sync] = (release_cache / "sync").glob("*.json")
    [(shape, measured)] = store.read(SYNC, sync.stem).items()
    assert shape.startswith("node-ax2;") and measured.slowdown > 1
    assert store.problems == []


def test_the_release_entries_are_found_by_the_keys_their_readers_compute(release_cache: Path) -> None:
    """Each reader names an entry of the release by the key it computes from what it looks for."""
    from planner.probing.link_probe import cached_network
    from planner.profiles.cache import ProfileCache
    from planner.profiles.measured_sync import find_job_sync

    store = ProfileCache(release_cache)
    assert cached_network(store, ["node-d", "node-c", "node-b", "node-a"]).source.endswith("(cached)")
    [sync] = (release_cache / "sync").glob("*.json")
    assert find_job_sync(store, json.loads(sync.read_text())["inputs"])
    assert all(store.get(p.stem) is not None for p in release_cache.glob("*.json"))
    assert store.problems == []
