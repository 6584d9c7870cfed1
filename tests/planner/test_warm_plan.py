"""A warm plan is cheap (issue #15, item 4): with every profile in the cache, ``plan --no-ray`` of a built-in
model builds no model and imports no torch, and ``batchplan profile`` reads the same cache. (That probes
import no torch on a warm plan over Ray is checked in ``test_driver_ray.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from planner.cluster import load_cluster
from planner.job import JobSpec
from planner.obtain import job_fingerprint
from planner.profiles.cache import ProfileCache
from planner.profiles.key import job_key_inputs, key_of_inputs
from planner.profiles.profile import DeviceProfile
from tests.planner.cli_helpers import (
    DEMO_MIXED,
    REPO_ROOT,
    assert_ok,
    check_plan,
    cli_env,
    parse_json_stdout,
    run_cli,
)
from torchkit.estimate.identity import estimate_identity

GIB = 2**30
MIB = 2**20


def _seed_cache(cache_dir: Path, job: JobSpec) -> dict[str, str]:
    """A profile per GPU type of demo-mixed under the keys the planner computes: what a cold run leaves."""
    catalog = load_cluster(DEMO_MIXED).catalog
    keys = {}
    for gpu_name, per_sample_s in (
        ("A100-SXM4-80GB", 1 / 2600),
        ("V100-SXM2-16GB", 1 / 1100),
        ("T4", 1 / 300),
    ):
        gpu = catalog.get(gpu_name)
        profile = DeviceProfile.from_points(
            gpu=gpu_name,
            method="estimate",
            amp=job.amp_for(gpu),
            memory_points=[(b, 2 * GIB + 40 * MIB * b) for b in (32, 128, 512)],
            time_points=[(b, 0.01 + per_sample_s * b) for b in (32, 128, 512)],
        )
        fingerprint, torch_version = job_fingerprint(job)
        inputs = job_key_inputs(
            job,
            gpu,
            method="estimate",
            fingerprint=fingerprint,
            torch_version=torch_version,
            time_model=estimate_identity(),
        )
        key = key_of_inputs(inputs)
        ProfileCache(cache_dir).put(key, profile, inputs=inputs)
        keys[gpu_name] = key
    # a cold run also leaves the model's gradient layout (the sync model's input) beside the profiles
    from planner.obtain.gradients import gradient_layout
    from planner.store import CacheStore

    gradient_layout(job, job_fingerprint(job), CacheStore(cache_dir))
    return keys


def test_job_fingerprint_of_a_built_in_model_needs_no_torch() -> None:
    code = (
        "import sys; from planner.job import JobSpec; from planner.obtain import job_fingerprint; "
        "key = job_fingerprint(JobSpec(model='resnet50')); print(key[0], 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].startswith("src-") and out[1] == "False"


def test_job_fingerprint_changes_with_the_input() -> None:
    assert job_fingerprint(JobSpec(model="resnet50")) != job_fingerprint(JobSpec(model="resnet50", imgsz=128))
    assert job_fingerprint(JobSpec(model="resnet50")) != job_fingerprint(JobSpec(model="resnet18"))


def test_warm_plan_without_ray_imports_no_torch(tmp_path: Path) -> None:
    job = JobSpec(model="resnet50", global_batch=768)
    keys = _seed_cache(tmp_path / "cache", job)
    code = (
        "import sys; from planner.cli.main import main; code = main(sys.argv[1:]); "
        "sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}\\n'); raise SystemExit(code)"
    )
    argv = [
        "plan",
        "--no-ray",
        "--cluster",
        str(DEMO_MIXED),
        "--model",
        "resnet50",
        "--global-batch",
        "768",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-write",
        "--json",
    ]
    result = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    assert set(plan["profiles"]) == set(keys.values())  # every profile came from the cache
    assert "torch imported: False" in result.stderr
    assert result.stderr.count("from cache") == 3


def test_profile_reads_and_fills_the_cache_plan_uses(tmp_path: Path) -> None:
    job = JobSpec(model="resnet50")
    keys = _seed_cache(tmp_path / "cache", job)
    result = run_cli(
        "profile",
        "--gpu",
        "T4",
        "--model",
        "resnet50",
        "--cache-dir",
        tmp_path / "cache",
        "--json",
        cwd=tmp_path,
    )
    assert_ok(result)
    doc = parse_json_stdout(result)
    cached = json.loads((tmp_path / "cache" / f"{keys['T4']}.json").read_text())["profile"]
    assert doc["profile"]["time_points"] == cached["time_points"]  # the seeded curve, not a new estimate
    assert f"from the cache {tmp_path / 'cache' / keys['T4']}.json" in result.stderr
