"""torchkit: a clean re-implementation of the Ultralytics seed toolkit (``torch_utils.py``,
``autodevice.py``, ``autobatch.py``) plus a fake-tensor estimator of a training step's memory and FLOPs.

Every public name is importable from ``torchkit`` but loaded lazily (PEP 562): ``import torchkit`` imports
neither torch, CUDA nor NVML, so ``planner`` can use torchkit's pure-numpy parts (``torchkit.fit``,
``torchkit.catalog``) without paying for torch.
"""

from __future__ import annotations

from torchkit.lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    # versions
    **{
        name: "torchkit.versions"
        for name in (
            "TORCH_1_9", "TORCH_1_10", "TORCH_1_11", "TORCH_1_13", "TORCH_2_0", "TORCH_2_1", "TORCH_2_2",
            "TORCH_2_3", "TORCH_2_4", "TORCH_2_5", "TORCH_2_7", "TORCH_2_8", "TORCH_2_9", "TORCH_2_13",
            "check_torch_version",
        )
    },
    # device parsing and selection
    "parse_device": "torchkit.device",
    "select_device": "torchkit.device",
    "get_torch_device_backend": "torchkit.device",
    "get_cpu_info": "torchkit.device",
    "get_gpu_info": "torchkit.device",
    # NVML inventory and idle choice
    "GPUInfo": "torchkit.nvml",
    # precision
    "smart_inference_mode": "torchkit.precision",
    "autocast": "torchkit.precision",
    # fusion
    "fuse_conv_and_bn": "torchkit.fusion",
    "fuse_deconv_and_bn": "torchkit.fusion",
    # model stats
    "model_info": "torchkit.stats",
    "get_flops": "torchkit.stats",
    "get_num_params": "torchkit.stats",
    "get_num_gradients": "torchkit.stats",
    "model_info_for_loggers": "torchkit.stats",
    # model helpers
    "attempt_compile": "torchkit.model_utils",
    "unwrap_model": "torchkit.model_utils",
    "is_parallel": "torchkit.model_utils",
    "initialize_weights": "torchkit.model_utils",
    "copy_attr": "torchkit.model_utils",
    "intersect_dicts": "torchkit.model_utils",
    "scale_img": "torchkit.model_utils",
    # training mechanics
    "ModelEMA": "torchkit.training",
    "EarlyStopping": "torchkit.training",
    "one_cycle": "torchkit.training",
    "init_seeds": "torchkit.training",
    "unset_deterministic": "torchkit.training",
    # distributed
    "torch_distributed_zero_first": "torchkit.distributed",
    # profiling
    "time_sync": "torchkit.profiling",
    "cuda_memory_usage": "torchkit.profiling",
    "profile_ops": "torchkit.profiling",
    # checkpoints
    "strip_optimizer": "torchkit.checkpoint",
    "convert_optimizer_state_dict_to_fp16": "torchkit.checkpoint",
    # autobatch
    "check_train_batch_size": "torchkit.autobatch",
    "autobatch": "torchkit.autobatch",
    "estimate_batch": "torchkit.autobatch",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
