"""SLURM's text as batchplan reads it (``planner/probing/slurm.py``) and the srun line of a mixed plan
(``planner/plan/slurm_launch.py``): pure functions, no SLURM needed (``tests/planner/cli/test_cli_slurm.py``
runs them against a real one)."""

from __future__ import annotations

import shlex

import pytest

from planner.errors import ConfigError
from planner.plan.io import validate_plan
from planner.plan.slurm_launch import node_script, srun_argv
from planner.probing.slurm import (
    GresGpus,
    allocation_cluster,
    gres_gpu_spec,
    gres_table,
    parse_gres_gpus,
    parse_job_node_gres,
    parse_sinfo_nodes,
)
from tests.plans import make_plan
from torchkit.hardware.catalog import load_catalog

CATALOG = load_catalog()


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu:a100:4", [GresGpus(gres_type="a100", count=4)]),
    ("gpu:a100:2(S:0-1),mps:100", [GresGpus(gres_type="a100", count=2)]),
    ("gpu:4", [GresGpus(gres_type=None, count=4)]),
    ("gpu:t4:1(IDX:0),gpu:v100:2(IDX:1-2)", [GresGpus(gres_type="t4", count=1), GresGpus(gres_type="v100", count=2)]),
    ("(null)", []),
    ("", []),
])
def test_gres_strings_give_their_gpu_entries(text: str, expected: list[GresGpus]) -> None:
    assert parse_gres_gpus(text, "node n") == expected


def test_gres_type_names_map_through_the_table_then_the_catalog() -> None:
    table = gres_table()
    assert gres_gpu_spec("a100", table, CATALOG, "n").name == "A100-SXM4-40GB"
    assert gres_gpu_spec("nvidia_a100_80gb", table, CATALOG, "n").name == "A100-SXM4-80GB"  # AutoDetect=nvml form
    assert gres_gpu_spec("A100-SXM4-80GB", table, CATALOG, "n").name == "A100-SXM4-80GB"  # a catalog name
    assert gres_gpu_spec("a100", gres_table(["a100=A100-SXM4-80GB"]), CATALOG, "n").name == "A100-SXM4-80GB"
    with pytest.raises(ConfigError, match=r"node n: GRES gpu:mystery .*--gres-type mystery=TYPE"):
        gres_gpu_spec("mystery", table, CATALOG, "node n")
    with pytest.raises(ConfigError, match=r"--gres-type gpu=TYPE"):
        gres_gpu_spec(None, table, CATALOG, "node n")
    with pytest.raises(ConfigError, match=r"--gres-type 'a100' is invalid"):
        gres_table(["a100"])


def test_sinfo_lines_keep_usable_gpu_nodes_and_say_why_others_are_left_out() -> None:
    text = "\n".join([
        "gpu1|gpu:a100:4(S:0-1)|idle|512000|64",
        "gpu2|gpu:v100:8|mix|384000|40",
        "gpu3|gpu:t4:1|drain*|128000|16",
        "cpu1|(null)|idle|128000|32",
        "gpu1|gpu:a100:4(S:0-1)|idle|512000|64",  # listed again for a second partition
    ])
    found = parse_sinfo_nodes(text, partition="p", table=gres_table(), catalog=CATALOG)
    assert [(n.name, len(n.gpus), n.gpus[0].spec.name) for n in found.cluster.nodes] == [
        ("gpu1", 4, "A100-SXM4-40GB"), ("gpu2", 8, "V100-SXM2-16GB")]
    assert found.cluster.nodes[0].cpu_count == 64
    assert found.cluster.nodes[0].host_memory_bytes == 512000 * 2**20
    assert found.skipped == ("gpu3: state drain (`scontrol show node gpu3` says why)", "cpu1: no GPU GRES")
    with pytest.raises(ConfigError, match="partition 'p' has no nodes"):
        parse_sinfo_nodes("", partition="p", table=gres_table(), catalog=CATALOG)
    with pytest.raises(ConfigError, match="no usable GPU node"):
        parse_sinfo_nodes("gpu3|gpu:t4:1|down|1|1", partition="p", table=gres_table(), catalog=CATALOG)


def test_an_allocation_keeps_slurm_node_order_and_each_node_s_job_gres() -> None:
    detail = """JobId=7 JobName=train
   NumNodes=3 NumCPUs=3
   JOB_GRES=gpu:a100:3,gpu:t4:1
     Nodes=n[1-2] CPU_IDs=0 Mem=4000 GRES=gpu:a100:2(IDX:0-1)
     Nodes=n3 CPU_IDs=0 Mem=4000 GRES=gpu:t4:1(IDX:2)
"""
    lines = parse_job_node_gres(detail)
    assert lines == [("n[1-2]", "gpu:a100:2(IDX:0-1)"), ("n3", "gpu:t4:1(IDX:2)")]
    found = allocation_cluster(["n1", "n2", "n3", "n4"], [(["n1", "n2"], lines[0][1]), (["n3"], lines[1][1])],
                               job_id="7", table=gres_table(), catalog=CATALOG)
    assert [(n.name, len(n.gpus)) for n in found.cluster.nodes] == [("n1", 2), ("n2", 2), ("n3", 1)]
    assert found.skipped[0].startswith("n4: the job holds no GPU there")


def test_a_mixed_plan_gets_one_case_branch_per_node_rank() -> None:
    plan = validate_plan(make_plan(batches=(8, 8, 4), nodes=(("big", 2), ("small", 1))), "t")
    script = node_script(plan)
    assert script.startswith('case "$SLURM_NODEID" in 0) CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 exec')
    assert "--node-rank 0 --nproc-per-node 2 --master-addr big" in script
    assert "1) CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 exec torchrun --nnodes 2 --node-rank 1" in script
    argv = srun_argv(plan)
    assert argv[:7] == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--nodelist", "big,small"]
    assert shlex.split(shlex.join(argv)) == argv  # one word for bash -c however it is quoted
