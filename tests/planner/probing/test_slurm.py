"""SLURM's text as batchplan reads it (``planner/probing/slurm.py``) and the srun line of a mixed plan
(``planner/plan/slurm_launch.py``): pure functions, no SLURM needed (``tests/planner/cli/test_cli_slurm.py``
runs them against a real one)."""

from __future__ import annotations

import shlex

import pytest

from planner.errors import ConfigError
from planner.plan.io import validate_plan
from planner.plan.slurm_launch import node_script, srun_argv
from planner.probing.slurm import allocation_cluster, parse_job_node_gres, parse_sinfo_nodes
from planner.probing.slurm_gres import GresGpus, gres_gpu_spec, gres_table, parse_gres_gpus
from tests.plans import make_plan
from torchkit.hardware.catalog import load_catalog

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:a100:4", [GresGpus(gres_type="a100", count=4)]),
        ("gpu:a100:2(S:0-1),mps:100", [GresGpus(gres_type="a100", count=2)]),
        ("gpu:4", [GresGpus(gres_type=None, count=4)]),
        (
            "gpu:t4:1(IDX:0),gpu:v100:2(IDX:1-2)",
            [
                GresGpus(gres_type="t4", count=1, indices=(0,)),
                GresGpus(gres_type="v100", count=2, indices=(1, 2)),
            ],
        ),
        ("gpu:4(IDX:0-3)", [GresGpus(gres_type=None, count=4, indices=(0, 1, 2, 3))]),
        (
            "gpu(IDX:0,2-3)",
            [GresGpus(gres_type=None, count=3, indices=(0, 2, 3))],
        ),  # older scontrol: no count
        ("gpu:a100(IDX:1)", [GresGpus(gres_type="a100", count=1, indices=(1,))]),
        ("gpu:t4:2(IDX:N/A)", [GresGpus(gres_type="t4", count=2)]),
        ("gpu:0", []),
        ("(null)", []),
        ("", []),
    ],
)
def test_gres_strings_give_their_gpu_entries(text: str, expected: list[GresGpus]) -> None:
    assert parse_gres_gpus(text, "node n") == expected


def test_gres_type_names_map_through_the_table_then_the_catalog() -> None:
    table = gres_table()
    assert gres_gpu_spec("a100", table, CATALOG, "n").name == "A100-SXM4-40GB"
    assert (
        gres_gpu_spec("nvidia_a100_80gb", table, CATALOG, "n").name == "A100-SXM4-80GB"
    )  # AutoDetect=nvml form
    assert gres_gpu_spec("A100-SXM4-80GB", table, CATALOG, "n").name == "A100-SXM4-80GB"  # a catalog name
    assert gres_gpu_spec("a100", gres_table(["a100=A100-SXM4-80GB"]), CATALOG, "n").name == "A100-SXM4-80GB"
    with pytest.raises(ConfigError, match=r"node n: GRES gpu:mystery .*--gres-type mystery=TYPE"):
        gres_gpu_spec("mystery", table, CATALOG, "node n")
    with pytest.raises(ConfigError, match=r"--gres-type gpu=TYPE"):
        gres_gpu_spec(None, table, CATALOG, "node n")
    with pytest.raises(ConfigError, match=r"--gres-type 'a100' is invalid"):
        gres_table(["a100"])


def test_sinfo_lines_keep_usable_gpu_nodes_and_say_why_others_are_left_out() -> None:
    text = "\n".join(
        [
            "gpu1|gpu:a100:4(S:0-1)|idle|512000|64",
            "gpu2|gpu:v100:8|mix|384000|40",
            "gpu3|gpu:t4:1|drain*|128000|16",
            "cpu1|(null)|idle|128000|32",
            "gpu1|gpu:a100:4(S:0-1)|idle|512000|64",  # listed again for a second partition
        ]
    )
    found = parse_sinfo_nodes(text, partition="p", table=gres_table(), catalog=CATALOG)
    assert [(n.name, len(n.gpus), n.gpus[0].spec.name) for n in found.cluster.nodes] == [
        ("gpu1", 4, "A100-SXM4-40GB"),
        ("gpu2", 8, "V100-SXM2-16GB"),
    ]
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
    found = allocation_cluster(
        ["n1", "n2", "n3", "n4"],
        [(["n1", "n2"], lines[0][1]), (["n3"], lines[1][1])],
        job_id="7",
        table=gres_table(),
        catalog=CATALOG,
    )
    assert [(n.name, len(n.gpus)) for n in found.cluster.nodes] == [("n1", 2), ("n2", 2), ("n3", 1)]
    assert found.skipped[0].startswith("n4: the job holds no GPU there")


def test_a_mixed_plan_gets_one_case_branch_per_node_rank() -> None:
    plan = validate_plan(make_plan(batches=(8, 8, 4), nodes=(("big", 2), ("small", 1))), "t")
    script = node_script(plan)
    assert script.startswith(
        'case "$SLURM_NODEID" in 0) CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 exec'
    )
    assert "--node-rank 0 --nproc-per-node 2 --master-addr big" in script
    assert (
        "1) CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 exec torchrun --nnodes 2 --node-rank 1"
        in script
    )
    argv = srun_argv(plan)
    assert argv[:7] == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--nodelist", "big,small"]
    assert shlex.split(shlex.join(argv)) == argv  # one word for bash -c however it is quoted


def _indices_and_types(node) -> list[tuple[int, str]]:
    return [(gpu.index, gpu.spec.name) for gpu in node.gpus]


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        # issue #34: the generator read len(gpus) while extend grew it, so gpu:t4:4 gave indices 0, 2, 4, 6
        ("gpu:t4:4", [(0, "T4"), (1, "T4"), (2, "T4"), (3, "T4")]),
        ("gpu:t4:2,gpu:a10:2", [(0, "T4"), (1, "T4"), (2, "A10"), (3, "A10")]),
        ("gpu:a100:4(S:0-1)", [(i, "A100-SXM4-40GB") for i in range(4)]),
        ("gpu:8", [(i, "T4") for i in range(8)]),  # untyped, through --gres-type gpu=T4
    ],
)
def test_sinfo_nodes_number_their_gpus_0_to_n_minus_1_for_any_gres_layout(gres: str, expected) -> None:
    found = parse_sinfo_nodes(
        f"gpu01|{gres}|idle|1000|8", partition="p", table=gres_table(["gpu=T4"]), catalog=CATALOG
    )
    assert _indices_and_types(found.cluster.nodes[0]) == expected


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:t4:4(IDX:0-3)", [(0, "T4"), (1, "T4"), (2, "T4"), (3, "T4")]),
        (
            "gpu:t4:4(IDX:4-7)",
            [(0, "T4"), (1, "T4"), (2, "T4"), (3, "T4")],
        ),  # the job sees its cards as 0..n-1
        ("gpu:t4:2(IDX:0-1),gpu:a10:2(IDX:2-3)", [(0, "T4"), (1, "T4"), (2, "A10"), (3, "A10")]),
        # printed out of order: the job's card k is the one with the k-th smallest index on the node
        ("gpu:a10:1(IDX:3),gpu:t4:2(IDX:0,2)", [(0, "T4"), (1, "T4"), (2, "A10")]),
        ("gpu(IDX:1-2)", [(0, "T4"), (1, "T4")]),
    ],
)
def test_a_job_s_gres_with_card_indices_numbers_the_job_s_cards(gres: str, expected) -> None:
    found = allocation_cluster(
        ["n1"], [(["n1"], gres)], job_id="7", table=gres_table(["gpu=T4"]), catalog=CATALOG
    )
    assert _indices_and_types(found.cluster.nodes[0]) == expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "gpu01|gpu:t4:1000000000000|idle|1000|8",
            r"holds 1000000000000 GPUs, over the limit of 256 per node",
        ),
        ("gpu01|gpu:t4:" + "9" * 5000 + "|idle|1000|8", r"\(5000 digits\) GPUs, over the limit of 256"),
        (
            "gpu01|gpu:t4:200,gpu:a10:100|idle|1000|8",
            r"node gpu01: SLURM lists 300 GPUs, over the limit of 256",
        ),
        ("gpu01|gpu:t4:2|idle|1000|100000", r"node gpu01: SLURM lists 100000 CPUs, over the limit of 65536"),
        (
            "gpu01|gpu:t4:2|idle|" + "9" * 40 + "|8",
            r"node gpu01: SLURM lists 999999999999\.\.\. MB of memory",
        ),
        ("gpu\ufffd1|gpu:t4:2|idle|1000|8", r"SLURM lists a node name 'gpu\ufffd1' may hold only letters"),
        ("gpu\x1b[2J|gpu:t4:2|idle|1000|8", r"node name 'gpu\\x1b\[2J'"),
        ("gpu01|gpu:t4:2(IDX:0-99999999999)|idle|1000|8", r"index range '0-99999999999'"),
        ("gpu01|gpu:t4:2(IDX:0-3)|idle|1000|8", r"counts 2 card\(s\) but lists 4 index"),
        ("gpu01|gpu:t4:300(IDX:0-299)|idle|1000|8", r"lists over 256 card indices, the limit per node"),
        ("gpu01|gpu:t4:1(IDX:0),gpu:a10:1(IDX:0)|idle|1000|8", r"a GPU index in two GRES entries"),
        ("gpu01|gpu:\x1b]0;pwned\x07:2|idle|1000|8", r"GRES gpu:\\x1b\]0;pwned\\x07 names no GPU type"),
    ],
)
def test_slurm_answers_are_held_to_the_cluster_config_limits_with_their_text_escaped(
    line: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        parse_sinfo_nodes(line, partition="p", table=gres_table(), catalog=CATALOG)
    assert "\x1b" not in str(raised.value) and "\n" not in str(raised.value)


def test_a_partition_of_more_nodes_than_a_config_may_hold_is_refused_before_its_gpus_are_built() -> None:
    text = "\n".join(f"gpu{i:05d}|gpu:t4:1|idle|1000|8" for i in range(20_000))
    with pytest.raises(ConfigError, match="lists over 16384 nodes, the limit of a cluster config"):
        parse_sinfo_nodes(text, partition="p", table=gres_table(), catalog=CATALOG)
    many_gpus = "\n".join(f"gpu{i:05d}|gpu:t4:256|idle|1000|8" for i in range(257))
    with pytest.raises(ConfigError, match="holds over 65536 GPUs"):
        parse_sinfo_nodes(many_gpus, partition="p", table=gres_table(), catalog=CATALOG)
