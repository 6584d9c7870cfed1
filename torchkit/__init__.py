"""torchkit: a clean re-implementation of the Ultralytics seed toolkit (``torch_utils.py``,
``autodevice.py``, ``autobatch.py``) plus a fake-tensor estimator of a training step's memory and FLOPs.

Every public name is importable from ``torchkit`` but loaded lazily (PEP 562): ``import torchkit`` imports
neither torch, CUDA nor NVML, so ``planner`` can use torchkit's pure-numpy parts (``torchkit.step.fit``,
``torchkit.hardware.catalog``) without paying for torch.

Its packages: ``hardware``, ``step``, ``process``, ``estimate``, ``workloads``, ``seed_api``; its modules:
``autobatch`` (the seed's module path), ``errors`` (the errors a user can cause), ``units`` (byte units),
``versions`` (torch version flags), ``lazy`` (lazy public names).
"""

from __future__ import annotations

from torchkit.lazy import lazy_exports

# public name -> submodule that defines it: the seed's surface (torchkit.seed_api) and, for the four names the
# planner uses too, the engine modules that seed_api re-exports them from
_EXPORTS: dict[str, str] = {
    # versions
    **{
        name: "torchkit.versions"
        for name in (
            "TORCH_1_9",
            "TORCH_1_10",
            "TORCH_1_11",
            "TORCH_1_13",
            "TORCH_2_0",
            "TORCH_2_1",
            "TORCH_2_2",
            "TORCH_2_3",
            "TORCH_2_4",
            "TORCH_2_5",
            "TORCH_2_7",
            "TORCH_2_8",
            "TORCH_2_9",
            "TORCH_2_13",
            "check_torch_version",
        )
    },
    # device parsing and selection
    "parse_device": "torchkit.process.device",
    "select_device": "torchkit.seed_api.device",
    "get_torch_device_backend": "torchkit.seed_api.device",
    "get_cpu_info": "torchkit.hardware.host",
    "get_gpu_info": "torchkit.seed_api.device",
    # NVML inventory and idle choice
    "GPUInfo": "torchkit.seed_api.gpu_info",
    # precision
    "smart_inference_mode": "torchkit.seed_api.precision",
    "autocast": "torchkit.seed_api.precision",
    # fusion
    "fuse_conv_and_bn": "torchkit.seed_api.fusion",
    "fuse_deconv_and_bn": "torchkit.seed_api.fusion",
    # model stats
    "model_info": "torchkit.seed_api.stats",
    "get_flops": "torchkit.seed_api.stats",
    "get_num_params": "torchkit.seed_api.stats",
    "get_num_gradients": "torchkit.seed_api.stats",
    "model_info_for_loggers": "torchkit.seed_api.stats",
    # model helpers
    "attempt_compile": "torchkit.seed_api.model_utils",
    "unwrap_model": "torchkit.seed_api.model_utils",
    "is_parallel": "torchkit.seed_api.model_utils",
    "initialize_weights": "torchkit.seed_api.model_utils",
    "copy_attr": "torchkit.seed_api.model_utils",
    "intersect_dicts": "torchkit.seed_api.model_utils",
    "scale_img": "torchkit.seed_api.model_utils",
    # training mechanics
    "ModelEMA": "torchkit.seed_api.training",
    "EarlyStopping": "torchkit.seed_api.training",
    "one_cycle": "torchkit.seed_api.training",
    "init_seeds": "torchkit.seed_api.training",
    "unset_deterministic": "torchkit.seed_api.training",
    # distributed
    "torch_distributed_zero_first": "torchkit.process.zero_first",
    # profiling
    "time_sync": "torchkit.seed_api.profiling",
    "cuda_memory_usage": "torchkit.seed_api.profiling",
    "profile_ops": "torchkit.seed_api.profiling",
    # checkpoints
    "strip_optimizer": "torchkit.seed_api.checkpoint",
    "convert_optimizer_state_dict_to_fp16": "torchkit.seed_api.checkpoint",
    # autobatch (also a module path, ``torchkit.autobatch``, as Ultralytics' ``ultralytics.utils.autobatch``)
    "check_train_batch_size": "torchkit.seed_api.autobatch",
    "autobatch": "torchkit.seed_api.autobatch",
    "estimate_batch": "torchkit.seed_api.autobatch",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
