"""The MLPerf Training systems of the Hopper/Ada reference, priced by the plan machinery: per-GPU throughput
predicted against measured, and the spread the links make across three H100 PCIe systems.

    python bench/bench_mlperf.py            # a few minutes on 2 cores (fake passes of BERT-large)

Each system of ``../shared/reference/gpu-throughput-hopper-ada-turing.md`` (GPU type, GPU count, the link
between its GPUs as its MLPerf ``systems/*.json`` says) is a one-node cluster config (``intra: nvlink``,
``pcie``, ``pcie-x8`` or ``nvlink-bridge``), its ranks priced as a plan prices them:

* **compute** of one step on one GPU, in the benchmark's own software stack, as ratios inside that stack
  (never absolute PyTorch throughput):
  - ResNet-50 (NVIDIA's MXNet container): the calibrated roofline of the card's architecture with the
    ``mlperf-mxnet`` stack's two terms (``time_model.json``), on the ResNet-50 kernel table at the system's
    batch;
  - BERT-large (NVIDIA's PyTorch container): no stack calibration exists, and the container runs two kernel
    sets: on Hopper Transformer Engine with FP8 attention (``use_transformer_engine2=True``, "using fp8 FMHA"
    in the logs), on Ada fp16 fused attention (``use_transformer_engine2=False``). So one anchor each: the 8
    H100 SXM of NVIDIA's system on NVSwitch, and xFusion's 8 L40S (their synchronisation removed by the same
    model); every other card of the same kernel set scaled by the roofline's ratio to its anchor on a
    BERT-large kernel table (a fake pass of the model below, 512-token rows holding two sequences each:
    ``packed_samples``, average packing 2);
* **synchronisation**: the ring over the node's link (``planner.plan.comm.ring_hops`` over the config's
  ``intra``), one all-reduce of the fp16 gradients (2 bytes a parameter) after the backward pass, not
  overlapped with it: the BERT logs run ``DistributedFusedLAMB`` with ``dwu_overlap_reductions=False`` (a
  reduce-scatter and an all-gather, the volume of one all-reduce), the ResNet-50 configs one Horovod group
  (``MXNET_HOROVOD_NUM_GROUPS=1``) inside a CUDA graph of the whole step.

Nothing here is fitted to the three H100 PCIe systems (``bench_mlperf`` keeps them out of the calibration:
``tests/torchkit/estimate/test_time_calibration.py``); their measured spread is what the links must explain.
Two more 8-GPU H100 PCIe systems (ASUSTeK ESC8000A-E12, Supermicro AS-4125GS-TNRT, MLPerf v3.0) sit on two AMD
EPYC sockets like the Lenovo, at x16: the line ``bert H100 PCIe on AMD EPYC hosts`` shows whether NCCL's P2P
through an AMD CPU (``AMD_HOST_SYSTEMS``) explains the Lenovo's sync; they are test rows, never fitted.
The last line is one ``mlperf:`` summary; ``ratio_rows``/``ratio_rms`` (RMS of log predicted / measured)
cover every row but the two BERT anchors.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.cluster import parse_cluster  # noqa: E402
from planner.plan.comm import SyncInputs, ring_hops  # noqa: E402
from planner.plan.types import RankSlot  # noqa: E402
from torchkit.estimate.calibration.stacks import STACKS  # noqa: E402
from torchkit.estimate.calibration.tables import TABLES_PATH, table_key  # noqa: E402
from torchkit.estimate.roofline import KernelTable, PlacedTable  # noqa: E402
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, load_time_model  # noqa: E402
from torchkit.hardware.catalog import load_catalog  # noqa: E402

V30, V31, V40 = (
    "mlcommons/training_results_v3.0@63e326c4",
    "mlcommons/training_results_v3.1@d06288b2",
    "mlcommons/training_results_v4.0@6fe95437",
)
BERT_SEQ_LEN = 512
BERT_PACKING = 2
"""sequences per 512-token row (the logs' ``average_packing_rate=2``): a per-GPU batch of 96 is 48 rows"""
RESNET50_PARAMS = 25_557_032
"""torchvision ResNet-50 v1.5 parameters (MLPerf's is the same network)"""
GRAD_BYTES_PER_PARAM = 2
"""fp16 gradients: MXNet's multi-precision LARS keeps fp16 weights and gradients; DistributedFusedLAMB
reduce-scatters fp16 gradients and all-gathers fp16 parameters"""
SPREAD_SYSTEMS = ("Quanta D54U-3U", "ASUSTeK ESC8000-E11", "Lenovo SR675 V3")
"""the three H100 PCIe systems, in the measured order (4 on NVLink bridges, 8 on PCIe 5.0 x16, 8 on x8)"""
AMD_HOST_SYSTEMS = ("ASUSTeK ESC8000A-E12", "Supermicro AS-4125GS", "Lenovo SR675 V3")
"""the 8 H100 PCIe systems on two AMD EPYC sockets with a BERT-large result (x16, x16, x8). NCCL before 2.23 (every
container here) runs P2P through an AMD CPU for any GPU count (``p2pLevel = PATH_SYS``; on Intel only under a
common PCIe switch, else through host memory); 2.23 stopped that for 3+ GPUs, "P2P would cause a significant
performance degradation when using many GPUs" (NVIDIA/nccl v2.23.4-1 release note). The two x16 systems test
whether that path explains the Lenovo's slow sync: the same mechanism, not the three systems of the spread"""


@dataclass(frozen=True, kw_only=True)
class System:
    """One MLPerf Training result: a system, a benchmark and its per-GPU throughput."""

    benchmark: str
    """``resnet`` or ``bert``"""
    name: str
    gpu: str
    """catalog GPU type"""
    gpus: int
    intra: str
    """the node's link as a cluster config writes it"""
    batch: int
    """per-GPU samples a step (global batch / GPUs; BERT: sequences)"""
    measured: float
    """per-GPU samples/s"""
    source: str
    calibrated: bool = False
    """a ResNet-50 row the calibration's fit saw"""
    kernels: str = ""
    """BERT: the container's kernel set on this card (``te-fp8`` on Hopper, ``fp16`` on Ada)"""


SYSTEMS: tuple[System, ...] = (
    # ResNet-50, NVIDIA's MXNet container
    System(
        benchmark="resnet",
        name="NVIDIA eos (DGX H100)",
        gpu="H100-SXM5-80GB",
        gpus=8,
        intra="nvlink",
        batch=400,
        measured=7053.9,
        source=f"{V31} NVIDIA/results/eos_ngc23.09_mxnet",
        calibrated=True,
    ),
    System(
        benchmark="resnet",
        name="Dell XE8640",
        gpu="H100-SXM5-80GB",
        gpus=4,
        intra="nvlink",
        batch=816,
        measured=7279.8,
        source=f"{V31} Dell/results/XE8640x4H100-SXM-80GB",
        calibrated=True,
    ),
    System(
        benchmark="resnet",
        name="Quanta D54Q-2U",
        gpu="H100-PCIe-80GB",
        gpus=2,
        intra="pcie",
        batch=408,
        measured=4548.9,
        source=f"{V30} Quanta_Cloud_Technology/results/D54Q-2U",
    ),
    System(
        benchmark="resnet",
        name="Quanta D54U-3U",
        gpu="H100-PCIe-80GB",
        gpus=4,
        intra="nvlink-bridge",
        batch=816,
        measured=4704.6,
        source=f"{V40} Quanta_Cloud_Technology/results/D54U-3U (NVLINK 600 GB/s + PCIe Gen5)",
    ),
    System(
        benchmark="resnet",
        name="ASUSTeK ESC8000-E11",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie",
        batch=400,
        measured=4504.9,
        source=f"{V31} ASUSTeK/results/ESC8000-E11-8xH100-PCIE-80GB (2x Intel Xeon "
        "8460Y+, PCIe 5.0, no NVLink)",
    ),
    System(
        benchmark="resnet",
        name="Lenovo SR675 V3",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie-x8",
        batch=400,
        measured=4147.8,
        source=f"{V31} Lenovo/results/SR675v3-8xH100_PCIe_80GB_350W (2x AMD EPYC 9554, host PCIe 5.0x8)",
    ),
    System(
        benchmark="resnet",
        name="Supermicro AS-4125GS",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie",
        batch=400,
        measured=4462.4,
        source=f"{V30} Supermicro/results/AS-4125GS-TNRT_8_H100-PCIe-80GB (2x AMD EPYC 9554, PCIe Gen5)",
    ),
    System(
        benchmark="resnet",
        name="NVIDIA (HGX H200)",
        gpu="H200-SXM-141GB",
        gpus=8,
        intra="nvlink",
        batch=400,
        measured=7950.1,
        source=f"{V40} NVIDIA/results/h200_ngc24.04_mxnet",
        calibrated=True,
    ),
    System(
        benchmark="resnet",
        name="xFusion G5500 V7",
        gpu="L40S",
        gpus=8,
        intra="pcie",
        batch=300,
        measured=2204.2,
        source=f"{V31} xFusion/results/G5500V7x8xL40S",
        calibrated=True,
    ),
    System(
        benchmark="resnet",
        name="Dell R760xa",
        gpu="L40S",
        gpus=4,
        intra="pcie",
        batch=400,
        measured=2185.4,
        source=f"{V40} Dell/results/R760xax4L40S",
        calibrated=True,
    ),
    System(
        benchmark="resnet",
        name="Fujitsu PRIMERGY CDI",
        gpu="L40S",
        gpus=8,
        intra="pcie",
        batch=300,
        measured=1858.5,
        source=f"{V40} Fujitsu/results/PRIMERGY-CDI-L40Sx8 (NGC 24.04)",
        calibrated=True,
    ),
    System(
        benchmark="resnet",
        name="xFusion G5500 V7",
        gpu="L40",
        gpus=8,
        intra="pcie",
        batch=300,
        measured=2009.8,
        source=f"{V31} xFusion/results/G5500V7x8L40",
    ),
    System(
        benchmark="resnet",
        name="xFusion 2288H V7",
        gpu="L4",
        gpus=6,
        intra="pcie",
        batch=110,
        measured=733.3,
        source=f"{V30} xFusion/results/2288H_V7x6xL4",
    ),
    # BERT-large, NVIDIA's PyTorch container (packed sequences; per-GPU batch in sequences)
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="NVIDIA eos (DGX H100)",
        gpu="H100-SXM5-80GB",
        gpus=8,
        intra="nvlink",
        batch=96,
        measured=970.0,
        source=f"{V31} NVIDIA/results/eos_ngc23.04_pytorch (the anchor)",
    ),
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="Quanta D54U-3U",
        gpu="H100-PCIe-80GB",
        gpus=4,
        intra="nvlink-bridge",
        batch=256,
        measured=653.8,
        source=f"{V40} Quanta_Cloud_Technology/results/D54U-3U (NVLINK 600 GB/s + PCIe Gen5)",
    ),
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="ASUSTeK ESC8000-E11",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie",
        batch=96,
        measured=512.8,
        source=f"{V31} ASUSTeK/results/ESC8000-E11-8xH100-PCIE-80GB (2x Intel Xeon "
        "8460Y+, PCIe 5.0, no NVLink)",
    ),
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="Lenovo SR675 V3",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie-x8",
        batch=96,
        measured=288.5,
        source=f"{V31} Lenovo/results/SR675v3-8xH100_PCIe_80GB_350W (2x AMD EPYC 9554, host PCIe 5.0x8)",
    ),
    # the same card on 8-GPU AMD EPYC hosts at x16: NCCL before 2.23 runs P2P through the CPU there, as on
    # the Lenovo (NVIDIA/nccl v2.18.5-1 src/graph/paths.cc; 2.23 stopped it for 3+ GPUs); not in SPREAD_SYSTEMS
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="ASUSTeK ESC8000A-E12",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie",
        batch=96,
        measured=505.2,
        source=f"{V30} ASUSTeK/results/ESC8000A-E12-8xH100-PCIE-80GB (2x AMD EPYC 9654, "
        "NCCL 2.17.1, PCIe 5.0)",
    ),
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="Supermicro AS-4125GS",
        gpu="H100-PCIe-80GB",
        gpus=8,
        intra="pcie",
        batch=96,
        measured=490.4,
        source=f"{V30} Supermicro/results/AS-4125GS-TNRT_8_H100-PCIe-80GB (2x AMD EPYC 9554, PCIe Gen5)",
    ),
    System(
        benchmark="bert",
        kernels="te-fp8",
        name="NVIDIA (HGX H200)",
        gpu="H200-SXM-141GB",
        gpus=8,
        intra="nvlink",
        batch=96,
        measured=998.3,
        source=f"{V40} NVIDIA/results/h200_ngc23.09_pytorch",
    ),
    System(
        benchmark="bert",
        kernels="fp16",
        name="xFusion G5500 V7",
        gpu="L40S",
        gpus=8,
        intra="pcie",
        batch=44,
        measured=141.9,
        source=f"{V31} xFusion/results/G5500V7x8xL40S",
    ),
    System(
        benchmark="bert",
        kernels="fp16",
        name="Dell R760xa",
        gpu="L40S",
        gpus=4,
        intra="pcie",
        batch=44,
        measured=121.0,
        source=f"{V40} Dell/results/R760xax4L40S",
    ),
    System(
        benchmark="bert",
        kernels="fp16",
        name="xFusion G5500 V7",
        gpu="L40",
        gpus=8,
        intra="pcie",
        batch=56,
        measured=128.7,
        source=f"{V31} xFusion/results/G5500V7x8L40",
    ),
    System(
        benchmark="bert",
        kernels="fp16",
        name="xFusion 2288H V7",
        gpu="L4",
        gpus=6,
        intra="pcie",
        batch=40,
        measured=53.5,
        source=f"{V31} xFusion/results/2288H_V7x6xL4",
    ),
)
BERT_ANCHORS = {
    kernels: next(s for s in SYSTEMS if s.benchmark == "bert" and (s.name, s.gpu) == (name, gpu))
    for kernels, name, gpu in (
        ("te-fp8", "NVIDIA eos (DGX H100)", "H100-SXM5-80GB"),
        ("fp16", "xFusion G5500 V7", "L40S"),
    )
}
"""kernel set -> the BERT system that anchors it"""


def bert_large():
    """BERT-large as MLPerf trains it, in plain torch: 24 post-norm layers of 1024 wide, 16 heads, 4096 feed
    forward, GELU, dropout 0.1, a 30522-token vocabulary tied to the masked-LM decoder, which runs on the
    masked positions only (``dense_seq_output``: 76 a sequence, ``max_predictions_per_seq``)."""
    import torch
    from torch import nn

    class BertLarge(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(30522, 1024)
            self.positions = nn.Embedding(BERT_SEQ_LEN, 1024)
            layer = nn.TransformerEncoderLayer(
                1024, 16, 4096, dropout=0.1, activation="gelu", batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, 24, enable_nested_tensor=False)
            self.head = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.LayerNorm(1024))
            self.bias = nn.Parameter(torch.zeros(30522))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
            h = self.encoder(h)[:, : 76 * BERT_PACKING]  # the masked positions of the row's sequences
            return self.head(h) @ self.tokens.weight.T + self.bias

    return BertLarge()


def _bert_workload():
    import torch

    from torchkit.workloads.workload import Workload

    def make_batch(rows: int):
        return torch.randint(0, 30522, (rows, BERT_SEQ_LEN)), torch.randint(
            0, 30522, (rows, 76 * BERT_PACKING)
        )

    def loss(logits, targets):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return Workload(
        name="bench.bench_mlperf:bert_large",
        sample_shape=(BERT_SEQ_LEN,),
        build_model=bert_large,
        make_batch=make_batch,
        loss_fn=loss,
        description="BERT-large, MLPerf phase 2",
    )


def bert_tables(batches: set[int]) -> tuple[dict[int, KernelTable], int]:
    """The BERT-large kernel table per per-GPU batch of sequences (a fake pass each), and its parameter count."""
    from torchkit.estimate.estimator import estimate_step
    from torchkit.estimate.roofline import kernel_table

    workload = _bert_workload()
    tables, params = {}, 0
    for batch in sorted(batches):
        rows = batch // BERT_PACKING
        print(
            f"fake pass: BERT-large, {rows} rows of {BERT_SEQ_LEN} tokens ({batch} sequences)",
            file=sys.stderr,
            flush=True,
        )
        estimate = estimate_step(workload, rows, amp="fp16", optimizer="adamw")
        tables[batch] = kernel_table(estimate.kernels)
        params = estimate.num_params
    return tables, params


def resnet_tables(batches: set[int]) -> dict[int, KernelTable]:
    """The ResNet-50 fp16 kernel tables the calibration keeps (``kernel_tables.json``)."""
    doc = json.loads(TABLES_PATH.read_text())["tables"]
    return {b: KernelTable.from_json(doc[table_key("resnet50", b, "fp16")]) for b in batches}


def ring_for(system: System):
    """The ring of a plan over the system's GPUs: its one node's ``intra`` link, through the plan machinery."""
    cluster = parse_cluster(
        {
            "name": system.name,
            "nodes": [
                {"name": "node", "intra": system.intra, "gpus": [{"type": system.gpu, "count": system.gpus}]}
            ],
        },
        f"bench_mlperf ({system.name})",
    )
    slots = [
        RankSlot(
            node="node",
            device_index=i,
            gpu=system.gpu,
            profile="p",
            memory_budget_bytes=1,
            total_memory_bytes=1,
        )
        for i in range(system.gpus)
    ]
    inputs = SyncInputs(grad_bytes=(1,), gradients_source="bench", interconnect=cluster.interconnect)
    ring, hops = ring_hops(slots, inputs)
    return ring, hops[0].link if hops else None


@dataclass(frozen=True, kw_only=True)
class Priced:
    system: System
    compute_s: float
    sync_s: float
    link: str

    @property
    def predicted(self) -> float:
        return self.system.batch / (self.compute_s + self.sync_s)


def price_all() -> list[Priced]:
    catalog = load_catalog()
    model = load_time_model()
    stack = json.loads(DEFAULT_TIME_MODEL_PATH.read_text())["stacks"]["mlperf-mxnet"]
    graphs = STACKS["mlperf-mxnet"].cuda_graphs
    resnet = resnet_tables({s.batch for s in SYSTEMS if s.benchmark == "resnet"})
    bert, bert_params = bert_tables({s.batch for s in SYSTEMS if s.benchmark == "bert"})

    def eager_s(s: System) -> float:
        gpu = catalog.get(s.gpu)
        table = resnet[s.batch] if s.benchmark == "resnet" else bert[s.batch]
        placed = PlacedTable.of(table, gpu, channels_last=s.benchmark == "resnet")
        if s.benchmark == "resnet":
            return (
                placed.time_s(
                    model.constants_for(gpu), memory_traffic=stack["memory_traffic"], cuda_graphs=graphs
                )
                / stack["throughput_factor"]
            )
        return placed.time_s(model.constants_for(gpu), cuda_graphs=True)

    def sync_s(s: System) -> tuple[float, str]:
        ring, link = ring_for(s)
        params = RESNET50_PARAMS if s.benchmark == "resnet" else bert_params
        return ring.allreduce_s(params * GRAD_BYTES_PER_PARAM), (
            f"{link.name} {link.bus_bytes_per_s / 1e9:g} GB/s" if link else "-"
        )

    bert_scale = {}
    for kernels, anchor in BERT_ANCHORS.items():
        anchor_sync, _ = sync_s(anchor)
        anchor_compute_s = anchor.batch / anchor.measured - anchor_sync
        bert_scale[kernels] = anchor_compute_s / eager_s(anchor)
        print(
            f"BERT-large {kernels} anchor: {anchor.name} ({anchor.gpu}) {anchor.measured:g} seq/s per GPU, compute "
            f"{anchor_compute_s * 1e3:.1f} ms + sync {anchor_sync * 1e3:.1f} ms a step; the container runs "
            f"{1 / bert_scale[kernels]:.2f}x the eager roofline's speed there",
            file=sys.stderr,
        )
    out = []
    for s in SYSTEMS:
        compute = eager_s(s) * (bert_scale[s.kernels] if s.benchmark == "bert" else 1.0)
        sync, link = sync_s(s)
        out.append(Priced(system=s, compute_s=compute, sync_s=sync, link=link))
    return out


def named(priced: list[Priced], benchmark: str, names: tuple[str, ...]) -> list[Priced]:
    """The priced systems of ``benchmark`` called ``names``, in that order."""
    by_name = {p.system.name: p for p in priced if p.system.benchmark == benchmark}
    return [by_name[name] for name in names]


def main() -> int:
    priced = price_all()
    print(
        f"{'bench':6s} {'system':22s} {'gpu':15s} {'n':>2s} {'link':28s} {'batch':>5s} {'compute ms':>10s} "
        f"{'sync ms':>8s} {'pred/GPU':>8s} {'meas/GPU':>8s} {'pred/meas':>9s}"
    )
    errors = []
    for p in priced:
        s = p.system
        ratio = p.predicted / s.measured
        anchor = s in BERT_ANCHORS.values()
        mark = " (anchor)" if anchor else " (fit row)" if s.calibrated else ""
        if not anchor:
            errors.append(math.log(ratio))
        print(
            f"{s.benchmark:6s} {s.name[:22]:22s} {s.gpu:15s} {s.gpus:2d} {p.link[:28]:28s} {s.batch:5d} "
            f"{p.compute_s * 1e3:10.1f} {p.sync_s * 1e3:8.1f} {p.predicted:8.1f} {s.measured:8.1f} {ratio:9.3f}{mark}"
        )
    spreads = {}
    for bench in ("bert", "resnet"):
        three = named(priced, bench, SPREAD_SYSTEMS)
        pred = [p.predicted for p in three]
        meas = [p.system.measured for p in three]
        order = pred == sorted(pred, reverse=True) and meas == sorted(meas, reverse=True)
        spreads[bench] = (order, max(pred) / min(pred), max(meas) / min(meas))
        print(
            f"{bench} H100 PCIe: "
            + ", ".join(
                f"{p.system.name} ({p.system.intra}) {p.predicted:.0f} vs {p.system.measured:.0f}"
                for p in three
            )
            + f"; spread predicted {spreads[bench][1]:.2f}x, measured {spreads[bench][2]:.2f}x"
        )
    amd = named(priced, "bert", AMD_HOST_SYSTEMS)
    print(
        "bert H100 PCIe on AMD EPYC hosts: "
        + ", ".join(
            f"{p.system.name} ({p.system.intra}) {p.predicted:.0f} vs {p.system.measured:.0f}" for p in amd
        )
    )
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    print(
        f"mlperf: bert_order={str(spreads['bert'][0]).lower()} bert_spread_pred={spreads['bert'][1]:.2f} "
        f"bert_spread_meas={spreads['bert'][2]:.2f} resnet_spread_pred={spreads['resnet'][1]:.2f} "
        f"resnet_spread_meas={spreads['resnet'][2]:.2f} ratio_rows={len(errors)} ratio_rms={rms:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
