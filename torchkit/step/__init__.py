"""The training step and what is learnt from running it: ``train_step`` (the one step that autobatch, the
measurement and the fake-tensor estimator all run), ``options`` (its amp modes and optimizers), ``budget``
(the one budget rule: a fraction of the available memory), ``oom`` (recognising out-of-memory), ``fit``
(memory and time curves over the batch size, pure numpy), ``clock`` (timing marks on the step's device: CUDA
events or a host clock) and ``measure`` (real steps on a device).

Importing this package imports no torch: ``fit`` is used by the torch-free planner core.
"""
