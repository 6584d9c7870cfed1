"""planner: cluster-level batch planning for PyTorch DDP on mixed GPUs.

``import planner`` is cheap: it imports neither torch, Ray nor pynvml. The allocation maths is plain numpy;
Ray, NVML and torch are imported inside the functions at the edges that need them.
"""

__version__ = "0.1.0"
