"""Calibration of the step-time model on public measured training throughput.

* ``measured_throughput.csv`` — the data: one measured (model, GPU, precision, layout, batch) per row, each
  with its source; read and checked by :mod:`.data`, the software stack of each row by :mod:`.stacks`.
* ``kernel_tables.json`` — the estimator's kernel table (FLOPs/bytes per kernel class) of every measured
  configuration, cached so the fit needs no fake pass (:mod:`.tables`; refreshed by
  ``python bench/calibrate_time.py --refresh-tables``).
* ``time_model.json`` — the fitted constants the estimator reads (:mod:`torchkit.estimate.time_model`),
  written by ``python bench/calibrate_time.py`` with the fit of :mod:`.fit`; :mod:`.crossval` holds rows out
  of it and :mod:`.uncertainty` turns the held-out errors into a GPU type's sigma.
"""
