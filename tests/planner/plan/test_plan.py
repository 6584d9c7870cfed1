"""planner.plan.build: build_plan over RankSlots and DeviceProfiles (rank numbering, loss weights, CUDA_VISIBLE_DEVICES,
torchrun lines, exclusions, warnings), the atomic write_plan, and load_plan/validate_plan's rejections."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shlex
import stat
from pathlib import Path

import numpy as np
import pytest

from planner.allocate.advice import AdviceKind
from planner.allocate.allocation import allocate
from planner.codec import encode
from planner.errors import InfeasiblePlanError
from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.io import SCHEMA, load_plan, validate_plan, write_plan
from planner.plan.launch import DEFAULT_MASTER_PORT
from planner.plan.types import ExcludedDevice, ExclusionKind, RankSlot
from planner.profiles.profile import MAX_PLANNED_BATCH, DeviceProfile
from torchkit.errors import ConfigError

GIB = 2**30
MIB = 2**20


def affine_profile(
    gpu: str, *, t0: float, t1: float, intercept=2 * GIB, per_sample=16 * MIB, notes=()
) -> DeviceProfile:
    batches = (1, 16, 64, 256)
    return DeviceProfile.from_points(
        gpu=gpu,
        method="estimate",
        amp="fp16",
        memory_points=[(b, intercept + per_sample * b) for b in batches],
        time_points=[(b, t0 + t1 * b) for b in batches],
        notes=notes,
    )


PROFILES = {
    "k-a100": affine_profile("A100-SXM4-80GB", t0=0.01, t1=0.0005, notes=("A100-SXM4-80GB: estimated",)),
    "k-t4": affine_profile("T4", t0=0.01, t1=0.002, notes=("T4: estimated", "shared note")),
    "k-v100": affine_profile("V100-SXM2-16GB", t0=0.01, t1=0.001, notes=("shared note",)),
}


def slot(node, index, profile, budget_gib, total_gib=16, visible=""):
    gpu = PROFILES[profile].gpu
    return RankSlot(
        node=node,
        device_index=index,
        gpu=gpu,
        profile=profile,
        memory_budget_bytes=int(budget_gib * GIB),
        total_memory_bytes=int(total_gib * GIB),
        visible_id=visible,
    )


#: node-a: two A100s named by UUID; node-b: T4s 0 and 2 (1 was skipped upstream as busy); node-c: one V100
SLOTS = (
    slot("node-a", 0, "k-a100", 48, 80, visible="GPU-aaaa-0000"),
    slot("node-a", 1, "k-a100", 48, 80, visible="GPU-aaaa-0001"),
    slot("node-b", 0, "k-t4", 9, 15),
    slot("node-b", 2, "k-t4", 9, 15),
    slot("node-c", 3, "k-v100", 9.6, 16),
)
UPSTREAM = (ExcludedDevice(node="node-b", device_index=1, gpu="T4", reason="busy: 97% utilisation > 50%"),)


def read_plan(path) -> dict:
    """The document of a plan file as every reader reads it (``load_plan``), written back."""
    return encode(load_plan(path))


def make_plan(job=None, slots=SLOTS, **kwargs) -> dict:
    """The plan's JSON document: what plan.json holds (most tests check the file format)."""
    return encode(build_plan(job or JobSpec(model="m"), slots, PROFILES, **kwargs))


@pytest.fixture(scope="module")
def base_plan() -> dict:
    return make_plan(
        excluded=UPSTREAM,
        warnings=["node-b: GPU 0 is shared with python (pid 7)"],
        node_addresses={"node-a": "10.0.0.1", "node-b": "10.0.0.2"},
        master_port=29600,
        script="train_x.py",
    )


@pytest.fixture
def plan(base_plan) -> dict:
    return copy.deepcopy(base_plan)


# ---------------------------------------------------------------------------------------------- build_plan


def test_ranks_are_numbered_node_by_node_with_local_ranks(base_plan):
    got = [
        (r["rank"], r["node"], r["node_rank"], r["local_rank"], r["device_index"]) for r in base_plan["ranks"]
    ]
    assert got == [
        (0, "node-a", 0, 0, 0),
        (1, "node-a", 0, 1, 1),
        (2, "node-b", 1, 0, 0),
        (3, "node-b", 1, 1, 2),
        (4, "node-c", 2, 0, 3),
    ]
    assert [(n["name"], n["node_rank"], n["nproc_per_node"]) for n in base_plan["nodes"]] == [
        ("node-a", 0, 2),
        ("node-b", 1, 2),
        ("node-c", 2, 1),
    ]
    assert base_plan["world_size"] == 5


def test_loss_weights_are_batch_times_world_size_over_step_batch_and_sum_to_world_size(base_plan):
    world, step = base_plan["world_size"], base_plan["step_batch"]
    assert step == sum(r["batch"] for r in base_plan["ranks"])
    for r in base_plan["ranks"]:
        assert r["loss_weight"] == pytest.approx(r["batch"] * world / step)
    assert sum(r["loss_weight"] for r in base_plan["ranks"]) == pytest.approx(world)
    # uneven batches, so the weights really differ (fast A100s carry more)
    assert base_plan["ranks"][0]["loss_weight"] > 1 > base_plan["ranks"][2]["loss_weight"]


def test_batches_are_the_allocation_and_each_rank_fits_its_budget(base_plan):
    caps = [PROFILES[s.profile].max_batch(s.memory_budget_bytes) for s in SLOTS]
    expected = allocate(
        caps,
        [PROFILES[s.profile].time_fit.intercept_s for s in SLOTS],
        [PROFILES[s.profile].time_fit.s_per_sample for s in SLOTS],
        groups=[s.profile for s in SLOTS],
    )
    assert [r["batch"] for r in base_plan["ranks"]] == expected.batches.tolist()
    assert base_plan["throughput_samples_per_s"] == pytest.approx(expected.throughput_samples_per_s)
    assert base_plan["predicted_step_time_s"] == pytest.approx(expected.step_time_s)
    for r, s, cap in zip(base_plan["ranks"], SLOTS, caps, strict=True):
        profile = PROFILES[s.profile]
        assert r["max_batch"] == cap
        assert 1 <= r["batch"] <= cap
        assert r["predicted_memory_bytes"] == profile.memory_bytes(r["batch"])
        assert r["predicted_memory_bytes"] <= r["memory_budget_bytes"] == s.memory_budget_bytes
        assert r["total_memory_bytes"] == s.total_memory_bytes
        assert r["predicted_step_time_s"] == pytest.approx(profile.step_time_s(r["batch"]))
        assert 0.0 <= r["idle_fraction"] < 1.0
        assert (r["gpu"], r["profile"]) == (s.gpu, s.profile)


def test_cuda_visible_devices_lists_each_nodes_devices_in_local_rank_order(base_plan):
    visible = {n["name"]: n["cuda_visible_devices"] for n in base_plan["nodes"]}
    # the UUID where the slot names one; the NVML index otherwise (with CUDA_DEVICE_ORDER=PCI_BUS_ID)
    assert visible == {"node-a": "GPU-aaaa-0000,GPU-aaaa-0001", "node-b": "0,2", "node-c": "3"}


def test_torchrun_lines_use_static_rendezvous_with_the_plans_node_ranks(base_plan):
    node_b = base_plan["nodes"][1]
    assert node_b["address"] == "10.0.0.2"
    assert node_b["torchrun"] == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,2 torchrun --nnodes 3 --node-rank 1 "
        "--nproc-per-node 2 --master-addr 10.0.0.1 --master-port 29600 train_x.py --plan plan.json"
    )
    for node in base_plan["nodes"]:
        argv = shlex.split(node["torchrun"])
        assert argv[:2] == [
            "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            f"CUDA_VISIBLE_DEVICES={node['cuda_visible_devices']}",
        ]
        flags = dict(zip(argv[3:13:2], argv[4:14:2], strict=True))
        assert flags == {
            "--nnodes": "3",
            "--node-rank": str(node["node_rank"]),
            "--nproc-per-node": str(node["nproc_per_node"]),
            "--master-addr": "10.0.0.1",
            "--master-port": "29600",
        }


def test_launch_names_the_master_of_the_first_node(base_plan):
    assert base_plan["launch"] == {
        "master_addr": "10.0.0.1",
        "master_port": 29600,
        "script": "train_x.py",
        "plan_path": "plan.json",
    }


def test_without_addresses_nodes_are_reached_by_name_on_the_default_port():
    plan = make_plan()
    assert plan["launch"] == {
        "master_addr": "node-a",
        "master_port": DEFAULT_MASTER_PORT,
        "script": "train.py",
        "plan_path": "plan.json",
    }
    assert [n["address"] for n in plan["nodes"]] == ["node-a", "node-b", "node-c"]
    assert (
        "--master-addr node-a --master-port 29500 train.py --plan plan.json" in plan["nodes"][2]["torchrun"]
    )


def test_a_master_address_that_is_no_host_name_is_refused():
    with pytest.raises(ConfigError, match="master_addr 'host name' is not a host name"):
        make_plan(node_addresses={"node-a": "host name"})


def test_upstream_and_allocation_exclusions_are_listed_with_reasons(base_plan):
    tiny = slot("node-c", 5, "k-v100", 1)  # 1 GiB budget < 2 GiB fixed memory: not a single sample
    plan = make_plan(slots=(*SLOTS, tiny), excluded=UPSTREAM)
    assert plan["excluded"][0] == {
        "node": "node-b",
        "device_index": 1,
        "gpu": "T4",
        "reason": "busy: 97% utilisation > 50%",
    }
    assert plan["excluded"][1] == {
        "node": "node-c",
        "device_index": 5,
        "gpu": "V100-SXM2-16GB",
        "reason": "does not fit a single sample < minimum batch 1",
        "kind": "below_min_batch",
    }
    assert len(plan["excluded"]) == 2
    assert (5, "node-c") not in {(r["device_index"], r["node"]) for r in plan["ranks"]}
    assert base_plan["excluded"] == [encode(e) for e in UPSTREAM]


def test_a_device_below_min_batch_is_excluded_with_the_minimum_in_the_reason():
    plan = make_plan(JobSpec(model="m", min_batch=460))  # caps: T4 448, V100 486
    reasons = {(e["node"], e["device_index"]): e["reason"] for e in plan["excluded"]}
    assert reasons == {
        ("node-b", 0): "fits at most 448 samples < minimum batch 460",
        ("node-b", 2): "fits at most 448 samples < minimum batch 460",
    }
    assert [r["node"] for r in plan["ranks"]] == ["node-a", "node-a", "node-c"]
    # node-b holds no rank: node ranks close up
    assert [(n["name"], n["node_rank"]) for n in plan["nodes"]] == [("node-a", 0), ("node-c", 1)]
    assert [r["node_rank"] for r in plan["ranks"]] == [0, 0, 1]
    # a GPU type left out whole warns of nothing (its calibration warning printed with every T4 excluded)
    assert "T4: estimated" not in plan["warnings"] and "shared note" in plan["warnings"]


def test_no_gpu_at_all_is_its_own_error():
    """Nothing found (not "nothing usable"): the CLI adds where to look (planner.cli.planning)."""
    from planner.errors import NoGpuError

    with pytest.raises(NoGpuError, match=r"no usable GPU to plan on \(no GPUs found\)"):
        build_plan(JobSpec(model="m"), [], PROFILES)
    with pytest.raises(InfeasiblePlanError, match="busy") as caught:
        build_plan(JobSpec(model="m"), [], PROFILES, excluded=UPSTREAM)
    assert not isinstance(caught.value, NoGpuError)


def test_when_the_first_node_has_no_rank_the_next_node_is_master():
    slots = (slot("node-z", 0, "k-t4", 1), *SLOTS[2:])
    plan = make_plan(slots=slots, node_addresses={"node-z": "10.0.0.9", "node-b": "10.0.0.2"})
    assert plan["nodes"][0]["name"] == "node-b"
    assert plan["launch"]["master_addr"] == "10.0.0.2"
    assert plan["ranks"][0]["rank"] == 0 and plan["ranks"][0]["node"] == "node-b"
    assert plan["excluded"][0]["node"] == "node-z"


def test_warnings_are_the_given_ones_then_profile_notes_once_then_the_advice(base_plan):
    warnings = base_plan["warnings"]
    assert warnings[0] == "node-b: GPU 0 is shared with python (pid 7)"
    # profile notes in profile-key order, each once
    assert warnings[1:4] == ["A100-SXM4-80GB: estimated", "T4: estimated", "shared note"]
    assert warnings.count("shared note") == 1
    caps = [PROFILES[s.profile].max_batch(s.memory_budget_bytes) for s in SLOTS]
    allocation = allocate(
        caps,
        [PROFILES[s.profile].time_fit.intercept_s for s in SLOTS],
        [PROFILES[s.profile].time_fit.s_per_sample for s in SLOTS],
        groups=[s.gpu for s in SLOTS],
    )
    advice = list(allocation.advice)
    assert warnings[len(warnings) - len(advice) :] == advice
    # the comparison with plain DDP is good news: a note, not a warning
    assert any("faster than 'uniform'" in n for n in base_plan["notes"])
    assert not any("faster than 'uniform'" in w for w in warnings)
    assert base_plan["notes"] == list(allocation.notes)


def test_sentences_name_gpu_types_never_profile_keys():
    # a T4 with a large fixed step cost: dropping the T4s is advised, by type (the keys are opaque hashes)
    profiles = {
        "e44fc649330660a4": affine_profile("A100-SXM4-80GB", t0=0.01, t1=0.0005),
        "354dd5c550a590fa": affine_profile("T4", t0=0.3, t1=0.002),
    }
    slots = [
        RankSlot(
            node=f"n{i // 2}",
            device_index=i % 2,
            gpu=profiles[key].gpu,
            profile=key,
            memory_budget_bytes=9 * GIB,
            total_memory_bytes=16 * GIB,
        )
        for i, key in enumerate(["e44fc649330660a4"] * 2 + ["354dd5c550a590fa"] * 2)
    ]
    plan = encode(build_plan(JobSpec(model="m"), slots, profiles))
    assert any(w.startswith("dropping the 2 T4 ranks (ranks 2-3) would be") for w in plan["warnings"]), plan
    for sentence in plan["warnings"] + plan["notes"]:
        assert not any(key in sentence for key in profiles), sentence


def test_caps_at_the_planned_batch_bound_are_warned_about():
    tiny = {"k": affine_profile("H100-SXM5-80GB", t0=0.01, t1=1e-6, intercept=GIB, per_sample=1)}
    plan = encode(
        build_plan(
            JobSpec(model="m"),
            [
                RankSlot(
                    node="n",
                    device_index=0,
                    gpu="H100-SXM5-80GB",
                    profile="k",
                    memory_budget_bytes=48 * GIB,
                    total_memory_bytes=80 * GIB,
                )
            ],
            tiny,
        )
    )
    assert plan["ranks"][0]["max_batch"] == MAX_PLANNED_BATCH
    assert any(f"some caps reach {MAX_PLANNED_BATCH}" in w for w in plan["warnings"])


def test_a_global_batch_is_reached_by_step_batch_times_accumulate():
    plan = make_plan(JobSpec(model="m", global_batch=8192))  # more than the Σ caps of one step
    assert plan["global_batch"] == 8192
    assert plan["accumulate"] > 1
    assert plan["step_batch"] * plan["accumulate"] == 8192
    assert plan["step_batch"] == sum(r["batch"] for r in plan["ranks"])
    assert plan["job"]["global_batch"] == 8192
    validate_plan(plan)


def test_multiple_of_applies_to_every_rank_batch():
    plan = make_plan(JobSpec(model="m", multiple_of=32))
    assert all(r["batch"] % 32 == 0 and r["max_batch"] % 32 == 0 for r in plan["ranks"])


def test_the_plan_document_has_every_documented_field_and_is_json(base_plan):
    assert base_plan["schema"] == SCHEMA
    assert {
        "schema",
        "created",
        "job",
        "world_size",
        "global_batch",
        "accumulate",
        "step_batch",
        "predicted_step_time_s",
        "throughput_samples_per_s",
        "balance_efficiency",
        "mode",
        "alternatives",
        "ranks",
        "nodes",
        "launch",
        "excluded",
        "profiles",
        "warnings",
    } <= set(base_plan)
    assert base_plan["job"] == encode(JobSpec(model="m"))
    assert base_plan["mode"] == "balanced"
    assert base_plan["accumulate"] == 1 and base_plan["global_batch"] == base_plan["step_batch"]
    assert 0 < base_plan["balance_efficiency"] <= 1
    assert base_plan["profiles"] == {k: encode(p) for k, p in PROFILES.items()}
    assert json.loads(json.dumps(base_plan)) == base_plan
    validate_plan(base_plan)


def test_the_expected_balance_range_holds_the_predicted_one_and_widens_with_the_time_models_error():
    """Profiles without uncertainty (measured) give a point; uncertain estimates a range around it."""
    assert make_plan()["balance_efficiency_range"] == [make_plan()["balance_efficiency"]] * 2
    uncertain = {k: dataclasses.replace(p, time_log_sigma=0.2) for k, p in PROFILES.items()}
    plan = encode(build_plan(JobSpec(model="m"), SLOTS, uncertain))
    low, high = plan["balance_efficiency_range"]
    assert low < plan["balance_efficiency"] <= high <= 1
    wider = build_plan(
        JobSpec(model="m"),
        SLOTS,
        {k: dataclasses.replace(p, time_log_sigma=0.4) for k, p in PROFILES.items()},
    )
    assert wider.balance_efficiency_range[0] < low
    validate_plan(plan)
    assert validate_plan(plan).balance_efficiency_range == (low, high)


def test_the_cluster_is_named_at_the_top_level():
    plan = make_plan(cluster="demo")
    assert plan["cluster"] == "demo" and validate_plan(plan).cluster == "demo"


def test_a_newer_writers_top_level_fields_are_kept_and_written_back_after_the_known_ones(plan):
    newer = {**plan, "created_by": "batchplan 9.0", "schedule": {"queue": "gpu", "slots": [1, 2]}}
    read = validate_plan(newer)
    assert read.extra == {"created_by": "batchplan 9.0", "schedule": {"queue": "gpu", "slots": [1, 2]}}
    assert list(encode(read))[-2:] == ["created_by", "schedule"] and encode(read) == newer


def test_no_slot_at_all_is_infeasible_naming_the_upstream_reasons():
    with pytest.raises(
        InfeasiblePlanError, match=r"no usable GPU to plan on \(node-b\[1\]: busy: 97% utilisation"
    ):
        build_plan(JobSpec(model="m"), [], PROFILES, excluded=UPSTREAM)
    with pytest.raises(InfeasiblePlanError, match=r"no usable GPU to plan on \(no GPUs found\)"):
        build_plan(JobSpec(model="m"), [], PROFILES)


def test_every_slot_too_small_is_infeasible():
    slots = [slot("n", 0, "k-t4", 1), slot("n", 1, "k-t4", 1.5)]
    with pytest.raises(InfeasiblePlanError, match="no rank can run the minimum batch 1"):
        build_plan(JobSpec(model="m"), slots, PROFILES)


def test_an_unreachable_global_batch_is_infeasible():
    # uniform over 5 ranks needs a multiple of 5 per step
    with pytest.raises(InfeasiblePlanError, match="global batch 7 cannot be split"):
        make_plan(JobSpec(model="m", global_batch=7, mode="uniform"))


def test_slots_not_grouped_by_node_still_get_torchrun_rank_numbering():
    slots = (SLOTS[0], SLOTS[2], SLOTS[1])  # node-a, node-b, node-a
    plan = make_plan(slots=slots)
    for r in plan["ranks"]:
        before = sum(n["nproc_per_node"] for n in plan["nodes"] if n["node_rank"] < r["node_rank"])
        assert r["rank"] == before + r["local_rank"]


# ---------------------------------------------------------------------------------------------- write / read


def leftovers(directory: Path) -> list[str]:
    """Files besides the plan and its index (``planner.plan.layout``): temporary files left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name not in ("plan.json", "plan.json.index"))


def test_write_then_read_gives_the_same_plan_and_leaves_no_temporary_file(plan, tmp_path):
    target = tmp_path / "sub" / "plan.json"
    assert write_plan(plan, target) == target
    assert read_plan(target) == plan
    assert target.read_text().endswith("}\n")
    assert leftovers(target.parent) == []


def test_write_replaces_an_existing_plan(plan, tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    write_plan(plan, str(target))
    assert read_plan(target) == plan


def test_a_failure_mid_write_leaves_the_old_file_intact_and_no_temporary_file(plan, tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    write_plan(plan, target)
    before = target.read_bytes()
    real_fdopen = os.fdopen

    class HalfWrite:
        """The temporary file, whose write stops half-way with ENOSPC, as a full disk would."""

        def __init__(self, fd, *args, **kwargs):
            self.handle = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            self.handle.write(text[: len(text) // 2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("planner.plan.io.os.fdopen", HalfWrite)
    with pytest.raises(ConfigError, match="No space left"):
        write_plan(plan, target)
    assert target.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_an_invalid_plan_is_not_written(plan, tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    plan["world_size"] = 99
    with pytest.raises(ConfigError, match="plan to write: world_size 99 != number of ranks 5"):
        write_plan(plan, target)
    assert target.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_a_written_plan_has_the_usual_permissions(plan, tmp_path):
    old = os.umask(0o022)
    try:
        target = write_plan(plan, tmp_path / "plan.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_reading_a_missing_file_says_how_to_make_one(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(
        ConfigError, match=rf"plan file {missing} does not exist \(create one with: batchplan plan"
    ):
        read_plan(missing)
    with pytest.raises(ConfigError, match="does not exist"):
        read_plan(tmp_path)  # a directory is not a plan file


@pytest.mark.parametrize(
    "content", [b"{not json", b"", b"\xff\xfe\x00garbage"], ids=["broken", "empty", "binary"]
)
def test_reading_a_file_that_is_not_json_is_a_config_error(tmp_path, content):
    target = tmp_path / "plan.json"
    target.write_bytes(content)
    with pytest.raises(
        ConfigError, match=rf"{target} is not valid JSON: .* \(regenerate it with batchplan plan"
    ):
        read_plan(target)


def _mutation(path: str, value=None, *, delete: bool = False):
    """Set (or delete) the field at a dotted path like ``ranks.0.batch``."""

    def mutate(plan: dict) -> None:
        *parents, last = path.split(".")
        obj = plan
        for part in parents:
            obj = obj[int(part)] if isinstance(obj, list) else obj[part]
        key = int(last) if isinstance(obj, list) else last
        if delete:
            del obj[key]
        else:
            obj[key] = value(obj[key]) if callable(value) else value

    return mutate


def _first_profile_key(plan):
    return next(iter(plan["profiles"]))


BAD_PLANS = {
    "wrong schema": (_mutation("schema", "batchplan/plan@2"), "has schema 'batchplan/plan@2', expected"),
    "no schema": (_mutation("schema", delete=True), "has schema None"),
    "missing top field": (_mutation("step_batch", delete=True), "lacks the field 'step_batch'"),
    "missing rank field": (
        _mutation("ranks.1.loss_weight", delete=True),
        "ranks[1] lacks the field 'loss_weight'",
    ),
    "missing node field": (_mutation("nodes.0.torchrun", delete=True), "nodes[0] lacks the field 'torchrun'"),
    "str for int": (_mutation("world_size", "5"), "world_size must be int, got '5'"),
    "float for int": (
        _mutation("accumulate", 1.0),
        "accumulate must be >= 1 (micro-steps per optimizer step), got 1.0",
    ),
    "bool for int": (_mutation("world_size", True), "world_size must be int, got True"),
    "bool for rank int": (_mutation("ranks.0.batch", True), "ranks[0].batch must be int, got True"),
    "bool for float": (
        _mutation("ranks.2.loss_weight", False),
        "ranks[2].loss_weight must be int/float, got False",
    ),
    "str for float": (_mutation("predicted_step_time_s", "1.0"), "predicted_step_time_s must be int/float"),
    "list for dict": (_mutation("profiles", []), "profiles must be dict"),
    "rank not an object": (_mutation("ranks.0", [1, 2]), "ranks[0] must be dict, got [1, 2]"),
    "rank order": (_mutation("ranks.1.rank", 3), "ranks[1].rank is 3, expected 1 (ranks must be in order)"),
    "unknown profile key": (
        _mutation("ranks.4.profile", "nope"),
        "ranks[4].profile 'nope' is not a key of profiles",
    ),
    "batch below one": (_mutation("ranks.0.batch", 0), "ranks[0].batch must be >= 1, got 0"),
    "world_size mismatch": (_mutation("world_size", 4), "world_size 4 != number of ranks 5"),
    "step_batch mismatch": (_mutation("step_batch", lambda v: v + 1), "step_batch"),
    "global != step x accumulate": (_mutation("accumulate", 2), "global_batch != step_batch × accumulate"),
    "nproc sum mismatch": (
        _mutation("nodes.2.nproc_per_node", 2),
        "nproc_per_node do not add up to world_size",
    ),
    "malformed profile": (
        lambda plan: plan["profiles"][_first_profile_key(plan)].pop("memory_fit"),
        "profiles['k-a100'] lacks the field 'memory_fit'",
    ),
    "inverted efficiency range": (
        _mutation("balance_efficiency_range", [0.9, 0.8]),
        "balance_efficiency_range [0.9, 0.8] must be [low, high] with low <= high",
    ),
    "efficiency range not a pair": (
        _mutation("balance_efficiency_range", [0.9]),
        "balance_efficiency_range must be",
    ),
    "unknown fit kind": (
        lambda plan: plan["profiles"][_first_profile_key(plan)]["time_fit"].update(kind="cubic"),
        "profiles['k-a100'].time_fit.kind must be one of affine, got 'cubic'",
    ),
}


@pytest.mark.parametrize(("mutate", "message"), BAD_PLANS.values(), ids=BAD_PLANS.keys())
def test_read_plan_rejects_a_malformed_plan_naming_the_file_and_the_field(plan, tmp_path, mutate, message):
    mutate(plan)
    target = tmp_path / "plan.json"
    target.write_text(json.dumps(plan))
    with pytest.raises(ConfigError) as info:
        read_plan(target)
    assert str(info.value).startswith(str(target))
    assert message in str(info.value)


def test_step_batch_mismatch_names_both_figures(plan):
    plan["step_batch"] += 1
    with pytest.raises(
        ConfigError,
        match=rf"step_batch {plan['step_batch']} != sum of rank batches "
        rf"{plan['step_batch'] - 1}",
    ):
        validate_plan(plan)


@pytest.mark.parametrize("document", [[], "plan", 3, None])
def test_a_plan_that_is_not_an_object_is_rejected(tmp_path, document):
    target = tmp_path / "plan.json"
    target.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="must be a JSON object"):
        read_plan(target)


def test_validate_plan_accepts_an_int_where_a_float_is_expected(plan):
    plan["predicted_step_time_s"] = 1
    plan["balance_efficiency"] = 1
    plan["balance_efficiency_range"] = [0, 1]
    validate_plan(plan)


def test_every_figure_in_a_plan_is_a_plain_python_value(base_plan):
    # every figure is a plain Python number (a numpy scalar would not serialise)
    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        else:
            assert not isinstance(value, np.generic), value

    walk(base_plan)


# ---------------------------------------------------------------------------------------------- the typed plan


def test_the_typed_plan_round_trips_through_its_json_document(base_plan):
    again = validate_plan(base_plan)
    assert encode(again) == base_plan
    assert json.loads(json.dumps(encode(again))) == base_plan
    assert again.ranks[0].rank == 0 and again.job == JobSpec(model="m")


def test_exclusions_carry_their_kind_and_their_reason_in_the_program_and_in_the_file():
    tiny = slot("node-d", 0, "k-t4", 0.5, 15)
    plan = build_plan(
        JobSpec(model="m"),
        (*SLOTS, tiny),
        PROFILES,
        excluded=(
            ExcludedDevice(
                node="node-b",
                device_index=1,
                gpu="T4",
                reason="busy",
                kind=ExclusionKind.SKIPPED_BY_SELECTION,
            ),
        ),
    )
    kinds = {(e.node, e.device_index): e.kind for e in plan.excluded}
    assert kinds == {
        ("node-b", 1): ExclusionKind.SKIPPED_BY_SELECTION,
        ("node-d", 0): ExclusionKind.BELOW_MIN_BATCH,
    }
    assert all(list(e) == ["node", "device_index", "gpu", "reason", "kind"] for e in encode(plan)["excluded"])
    assert validate_plan(encode(plan)).excluded == plan.excluded
    without_kind = {
        **encode(plan),
        "excluded": [{k: v for k, v in e.items() if k != "kind"} for e in encode(plan)["excluded"]],
    }
    assert all(
        e.kind is None for e in validate_plan(without_kind).excluded
    )  # a plan written before kinds were


def test_the_advice_is_typed_and_also_among_the_warnings():
    # a T4 with a large fixed step cost beside A100s: dropping the T4s is advised
    profiles = {
        "a": affine_profile("A100-SXM4-80GB", t0=0.01, t1=0.0005),
        "t": affine_profile("T4", t0=0.3, t1=0.002),
    }
    slots = [
        RankSlot(
            node=f"n{i // 2}",
            device_index=i % 2,
            gpu=profiles[key].gpu,
            profile=key,
            memory_budget_bytes=9 * GIB,
            total_memory_bytes=16 * GIB,
        )
        for i, key in enumerate("aatt")
    ]
    plan = build_plan(JobSpec(model="m"), slots, profiles)
    assert plan.advice, "a mixed cluster with a very slow type gets advice"
    assert all(isinstance(a.kind, AdviceKind) for a in plan.advice)
    assert all(a in plan.warnings for a in plan.advice)
    # notes are typed too, and are not warnings
    assert plan.notes and all(isinstance(n.kind, AdviceKind) for n in plan.notes)
    assert not set(plan.notes) & set(plan.warnings)
