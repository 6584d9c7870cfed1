"""Stage 3 of planning: per-rank batch sizes from the profiles (``allocation.allocate`` over ``solver``), advice on
a better choice of devices or mode (``advice``), and how the balance holds up when the step-time model is off
(``uncertainty``). Pure numpy.
"""
