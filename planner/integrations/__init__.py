"""Planned per-rank batches inside the trainers people run: Ultralytics (``ultralytics``: the planned trainers;
``ultralytics_trainer`` what they add to each task's trainer, ``ultralytics_autobatch`` the in-job plan from
Ultralytics' own AutoBatch probes, ``ultralytics_loader`` a rank's train loader, ``ultralytics_batchnorm``
BatchNorm for uneven batches).

Each integration imports its library only when used: importing this package imports none of them.
"""
