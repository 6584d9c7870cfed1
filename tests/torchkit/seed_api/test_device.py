"""torchkit.seed_api.device, the seed's device surface: parse_device (the seed's verified table,
CUDA_VISIBLE_DEVICES, idle picks mapped by UUID; defined in torchkit.process.device), select_device, and the
host/GPU description helpers (get_cpu_info from torchkit.hardware.host). NVML is the fake driver; torch's CUDA view is
faked with ``fake_cuda`` where a test needs GPUs."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from fake_pynvml import cuda_fastest_first, mixed_load_gpus, pci_order_gpus

from torchkit.errors import ConfigError
from torchkit.hardware.host import _clean_cpu_name
from torchkit.seed_api.device import (
    NUM_THREADS,
    get_cpu_info,
    get_gpu_info,
    get_torch_device_backend,
    parse_device,
    select_device,
)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ------------------------------------------------------------------------------------------------ parse_device


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ("", ""),
        (None, ""),
        ("cpu", "cpu"),
        ("CPU", "cpu"),
        ("mps", "mps"),
        ("cuda", "0"),
        ("cuda:0", "0"),
        ("cuda:0,1", "0,1"),
        ("0, 1", "0,1"),
        ([0, 1], "0,1"),
        ((0, 1), "0,1"),
        (0, "0"),
        ("'0'", "0"),
        ("0,,01", "0,1"),
        ("NPU:00", "npu:0"),
        ("npu", "npu"),
        ("xpu:0,1", "xpu:0,1"),
        ("tpu", "tpu"),  # not validated: passes through as text
        (torch.device("cuda"), ""),
        (torch.device("cuda:1"), "1"),
        (torch.device("cpu"), "cpu"),
        (torch.device("xpu", 0), "xpu:0"),
        (torch.device("xpu"), "xpu"),
    ],
)
def test_parse_device_canonical_forms(cuda_env, request_, expected):
    assert parse_device(request_) == expected


@pytest.mark.parametrize(
    ("visible", "count", "request_", "expected"),
    [
        ("3", 1, "3", "0"),  # physical 3 is torch 0
        ("3,5", 2, "5", "1"),
        ("3,5", 2, "3,5", "0,1"),
        (" 3, 5", 2, "5", "1"),
        ("03", 1, "3", "0"),
        ("1,2", 2, "2", "1"),
        ("1,2", 2, "1", "1"),  # in range: a torch index already (= physical 2)
        ("1,2", 2, "0,2", "0,2"),  # 0 is not visible: left as torch indices
        ("3", 1, "0", "0"),
        ("3", 0, "3", "3"),  # CUDA sees nothing: no translation
    ],
)
def test_parse_device_maps_physical_ids_under_cuda_visible_devices(
    cuda_env, monkeypatch, visible, count, request_, expected
):
    cuda_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    assert parse_device(request_) == expected
    assert parse_device(parse_device(request_)) == expected  # idempotent
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible


def test_minus_one_without_a_driver_is_the_default_device_with_one_warning(
    cuda_env, nvml_library_missing, caplog
):
    with caplog.at_level(logging.INFO):
        assert parse_device("-1") == ""
    [warning] = warnings_of(caplog)
    assert warning.startswith(
        "device=-1 cannot pick an idle GPU: NVML could not start (NVML Shared Library Not Found)"
    )
    assert warning.endswith("using the default device instead")


def test_minus_one_without_pynvml_says_why(cuda_env, pynvml_missing, caplog):
    with caplog.at_level(logging.INFO):
        assert parse_device("0,-1") == "0"  # unfilled -1 entries are dropped
    [warning] = warnings_of(caplog)
    assert "pip install nvidia-ml-py" in warning
    assert warning.endswith("it is dropped")


def test_minus_one_with_nvml_but_no_cuda_device_warns_once(cuda_env, fake_nvml, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with caplog.at_level(logging.INFO):
        assert parse_device("-1") == ""
    [warning] = warnings_of(caplog)
    assert "NVML sees 4 GPU(s) but torch sees none" in warning


def test_minus_one_picks_the_most_idle_gpus(cuda_env, fake_nvml, fake_cuda, caplog):
    fake_cuda(mixed_load_gpus())
    with caplog.at_level(logging.INFO):
        assert parse_device("-1") == "1"
        assert parse_device("-1,-1") == "1,2"
    assert warnings_of(caplog) == []  # same order on both sides: nothing to warn about


def test_minus_one_skips_gpus_named_in_the_same_request(cuda_env, fake_nvml, fake_cuda):
    fake_cuda(mixed_load_gpus())
    assert parse_device("1,-1") == "1,2"
    assert parse_device("0,-1") == "0,1"


def test_minus_one_requires_20_percent_free_memory_and_drops_the_rest(
    cuda_env, install_nvml, fake_cuda, caplog
):
    from fake_pynvml import GIB, FakeNvml

    gpus = mixed_load_gpus()
    gpus[0].memory_used_bytes = 15 * GIB  # 0.5 GiB free: below the seed's 20%
    install_nvml(FakeNvml(gpus))
    fake_cuda(gpus)
    with caplog.at_level(logging.INFO):
        assert parse_device("-1,-1,-1,-1") == "1,2,3"
    [warning] = warnings_of(caplog)
    assert warning == (
        "device=-1,-1,-1,-1: only 3 of 4 idle GPU(s) requested have >= 20% free memory; the unfilled -1 is dropped"
    )


def test_minus_one_maps_nvml_picks_to_torch_indices_by_uuid_when_orders_differ(
    cuda_env, fake_nvml_pci_order, fake_cuda, caplog
):
    # NVML (PCI order): 0 busy T4, 1 idle A100, 2 half-busy T4. CUDA (fastest first): 0 A100, 1 T4@1A, 2 T4@5E
    fake_cuda(cuda_fastest_first(pci_order_gpus()))
    with caplog.at_level(logging.INFO):
        assert parse_device("-1") == "0"  # the idle A100; positional mapping would give "1", the busy T4
        assert parse_device("-1,-1") == "0,2"
    warning = warnings_of(caplog)[0]
    assert warning.startswith("CUDA numbers the GPUs differently from NVML/nvidia-smi: ")
    assert "torch 0 = NVML 1 (00000000:3B:00.0), torch 1 = NVML 0 (00000000:1A:00.0)" in warning
    assert "set CUDA_DEVICE_ORDER=PCI_BUS_ID" in warning


def test_minus_one_matches_by_pci_bus_id_when_uuids_are_missing(cuda_env, fake_nvml_pci_order, fake_cuda):
    gpus = cuda_fastest_first(pci_order_gpus())
    for g in gpus:
        g.uuid = ""  # NVML could not give UUIDs; PCI ids still match
    fake_cuda(gpus)
    assert parse_device("-1") == "0"


def test_minus_one_only_picks_gpus_visible_to_torch(cuda_env, fake_nvml_pci_order, fake_cuda, caplog):
    cuda_env.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    cuda_env.setenv("CUDA_VISIBLE_DEVICES", "0,2")  # the idle A100 (NVML 1) is hidden
    nvml_gpus = pci_order_gpus()
    fake_cuda([nvml_gpus[0], nvml_gpus[2]])
    with caplog.at_level(logging.INFO):
        assert parse_device("-1") == "1"  # NVML 2 (50% busy) beats NVML 0 (90%); it is torch 1
    assert warnings_of(caplog) == []  # the CVD order is the PCI order: nothing to warn about


def test_minus_one_under_a_uuid_cuda_visible_devices(cuda_env, fake_nvml_pci_order, fake_cuda):
    nvml_gpus = pci_order_gpus()
    cuda_env.setenv("CUDA_VISIBLE_DEVICES", f"{nvml_gpus[2].uuid},{nvml_gpus[1].uuid}")
    fake_cuda([nvml_gpus[2], nvml_gpus[1]])
    assert parse_device("-1") == "1"  # the A100 is torch 1 here


def test_minus_one_falls_back_to_position_when_torch_has_no_ids(
    cuda_env, fake_nvml_pci_order, fake_cuda, caplog
):
    nvml_gpus = pci_order_gpus()
    cuda_env.setenv("CUDA_VISIBLE_DEVICES", f"{nvml_gpus[2].uuid[:12]},1")  # a UUID prefix, then an index
    fake_cuda([nvml_gpus[2], nvml_gpus[1]], with_ids=False)
    with caplog.at_level(logging.INFO):
        assert parse_device("-1") == "1"
    [warning] = warnings_of(caplog)
    assert warning.startswith("could not match torch's CUDA devices to NVML GPUs by UUID or PCI bus id")


# ------------------------------------------------------------------------------------------------ select_device


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_select_device_cpu_sets_threads_and_logs_the_cpu(cuda_env, restore_threads, caplog):
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.device"):
        assert select_device("cpu") == torch.device("cpu")
    assert torch.get_num_threads() == NUM_THREADS
    banner = caplog.records[-1].getMessage()
    assert banner.startswith("batchplan ")
    assert f"torch-{torch.__version__} CPU ({get_cpu_info()})" in banner


def test_select_device_default_without_cuda_is_cpu_and_mps_off_mac_is_cpu(cuda_env, restore_threads):
    assert select_device("") == torch.device("cpu")
    assert select_device("mps", verbose=False) == torch.device("cpu")


@pytest.mark.parametrize(("request_", "shown"), [("0", "0"), ("cuda", "0"), ("0,1", "0,1")])
def test_select_device_rejects_cuda_on_a_machine_without_it(cuda_env, monkeypatch, request_, shown):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        select_device(request_)
    message = str(info.value)
    assert message.startswith(f"Invalid CUDA 'device={shown}' requested. Use 'device=cpu'")
    assert "torch.cuda.is_available(): False" in message
    assert "torch.cuda.device_count(): 0" in message
    assert "os.environ['CUDA_VISIBLE_DEVICES']: None" in message
    assert "https://pytorch.org/get-started/locally/" in message
    assert isinstance(info.value, ValueError)


def test_select_device_passes_other_backends_through(cuda_env):
    meta = torch.device("meta")
    assert select_device(meta) is meta
    assert select_device("tpu:0") == "tpu:0"
    assert select_device("vulkan") == "vulkan"


def test_select_device_npu_needs_torch_npu_and_xpu_its_backend(cuda_env, monkeypatch):
    with pytest.raises(ConfigError, match="Invalid NPU 'device=npu'. Install 'torch_npu'"):
        select_device("npu")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="Invalid XPU 'device=xpu:0' requested. Backend is not available."):
        select_device("xpu:0")


def test_select_device_single_gpu_becomes_current(cuda_env, fake_cuda, caplog):
    fake_cuda(mixed_load_gpus()[:2])
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.device"):
        assert select_device("1") == torch.device("cuda:1")
    assert torch.cuda.set_device_calls == [1]
    assert caplog.records[-1].getMessage().endswith("CUDA:1 (Tesla V100-SXM2-16GB, 16384MiB)")


def test_select_device_multi_gpu_leaves_the_current_device(cuda_env, fake_cuda, caplog):
    fake_cuda(mixed_load_gpus()[:2])
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.device"):
        assert select_device("0,1") == torch.device("cuda:0")
        assert select_device("") == torch.device("cuda:0")  # the current device
    assert torch.cuda.set_device_calls == []
    lines = caplog.records[0].getMessage().splitlines()
    assert lines[0].endswith("CUDA:0 (Tesla V100-SXM2-16GB, 16384MiB)")
    assert lines[1] == " " * (len(lines[0]) - len("CUDA:0 (Tesla V100-SXM2-16GB, 16384MiB)")) + (
        "CUDA:1 (Tesla V100-SXM2-16GB, 16384MiB)"
    )


def test_select_device_rejects_an_index_beyond_the_count(cuda_env, fake_cuda):
    fake_cuda(mixed_load_gpus()[:2])
    with pytest.raises(ConfigError, match="Invalid CUDA 'device=2' requested") as info:
        select_device("2")
    assert "torch.cuda.device_count(): 2" in str(info.value)
    assert "pytorch.org" not in str(info.value)


def test_select_device_never_changes_cuda_visible_devices(cuda_env, fake_cuda, restore_threads):
    cuda_env.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    fake_cuda(mixed_load_gpus()[:2])
    select_device("cpu", verbose=False)
    select_device("1", verbose=False)
    select_device("0,1", verbose=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"


def test_select_device_resolves_minus_one_with_fake_nvml(cuda_env, fake_nvml, fake_cuda):
    fake_cuda(mixed_load_gpus())
    assert select_device("-1", verbose=False) == torch.device("cuda:1")


# ------------------------------------------------------------------------------------------------ helpers


def test_get_torch_device_backend_returns_the_device_module():
    assert get_torch_device_backend("cuda") is torch.cuda
    assert get_torch_device_backend("cuda:1") is torch.cuda
    assert get_torch_device_backend(torch.device("cpu")) is torch.cpu


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz", "Intel Core i7-8700K 3.70GHz"),
        ("Intel(R) Xeon(R) Platinum 8480+", "Intel Xeon Platinum 8480+"),
        ("AMD  EPYC   7763 64-Core Processor", "AMD EPYC 7763 64-Core Processor"),
        ("Apple M2", "Apple M2"),
    ],
)
def test_cpu_names_are_cleaned(raw, clean):
    assert _clean_cpu_name(raw) == clean


def test_get_cpu_info_names_this_cpu():
    name = get_cpu_info()
    assert name and "(R)" not in name and "(TM)" not in name


def test_get_gpu_info_describes_a_cuda_device(fake_cuda):
    fake_cuda(pci_order_gpus())
    assert get_gpu_info(0) == "Tesla T4, 15360MiB"
    assert get_gpu_info(1) == "NVIDIA A100-SXM4-80GB, 81920MiB"
