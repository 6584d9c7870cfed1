"""Stage 1 of planning: what each node has. ``inventory`` (a node's GPUs and host), ``probe`` (the NodeProbe Ray
actor that reads them on its node), ``session`` (the Ray session), ``backends`` (in-process or over Ray),
``make_profile`` (measure or estimate one device), ``cluster_devices`` (every node's inventory over Ray).

Importing this package imports no Ray or torch; the modules import them where they run."""
