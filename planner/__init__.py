"""planner: cluster-level batch planning for PyTorch DDP on mixed GPUs.

``import planner`` is cheap: it imports neither torch, Ray nor pynvml. The allocation maths is plain numpy;
Ray, NVML and torch are imported inside the functions at the edges that need them.

Its modules: ``job`` (what to plan: ``JobSpec`` and its vocabulary), ``cluster`` (on what: cluster configs),
``interconnect`` (the network and the intra-node links of a cluster), ``driver`` (probe, profile, allocate,
build), ``preflight`` (go/no-go checks), ``errors`` and ``events`` (the planner's errors, progress events);
the documents: ``codec`` (every record read and written as strict JSON), ``store`` (the cache directory),
``files`` (writing a file nothing can see half-written), ``jsonio`` (JSON that someone else may have written).
Its packages: ``probing`` (where things run), ``obtain`` (which profile, made how), ``profiles`` (the data of
a profile), ``allocate`` (per-rank batches), ``plan`` (the plan and plan.json), ``runtime`` (in the training
job), ``advise`` (which GPUs to rent), ``integrations`` (inside the trainers people run), ``cli``.
"""

__version__ = "0.1.0"
