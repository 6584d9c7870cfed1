"""Where this process runs: the devices a request names (``device.parse_device``: indices, ``-1`` for an idle
GPU, ``CUDA_VISIBLE_DEVICES``) and its place among the ranks of a job (``zero_first``: the first rank of each
node works while the others wait, and hears when it failed).

The engine's side of the seed's device and DDP helpers: the planner imports these, the seed's surface
(``torchkit.seed_api``) re-exports them. Importing this package imports no torch."""
