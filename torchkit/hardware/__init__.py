"""The hardware edge: the GPU catalog (``catalog``) and its strict YAML helpers (``configio``, ``yaml_limits``),
the intra-node links of a GPU type (``links``), NVML inventory (``nvml``), idle-GPU selection (``gpu_select``)
and the host's CPU name (``host``).

No module here imports torch; ``nvml`` imports ``pynvml`` only inside the functions that talk to the driver.
"""
