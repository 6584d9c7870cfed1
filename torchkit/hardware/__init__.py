"""The hardware edge: the GPU catalog and its strict YAML helpers, NVML inventory, idle-GPU selection.

No module here imports torch; ``nvml`` imports ``pynvml`` only inside the functions that talk to the driver."""
