"""Where things run: what each node has, and the processes that answer for it. ``inventory`` (a node's GPUs and
host), ``node_entry`` (the node as ``batchplan devices --json`` writes it), ``probe`` (the NodeProbe Ray actor
that reads them on its node and makes profiles there), ``session`` (the Ray session), ``ray_auth`` (Ray's token authentication), ``watchdog`` (stopping the Ray processes a dead
run left), ``backends`` (in-process or over Ray), ``busy`` (the shared-GPU policy), ``cluster_devices`` (every
node's inventory over Ray), ``link_probe`` (the network measured among the probes), ``slurm`` (a cluster from
a SLURM allocation or partition). Which profile and how it is made: ``planner.obtain``.

Importing this package imports no Ray or torch; the modules import them where they run.
"""
