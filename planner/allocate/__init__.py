"""Stage 3 of planning: per-rank batch sizes from the profiles (``solver``) and advice on a better choice of
devices (``advice``, which uses the solver; the solver never imports it). Plain numpy."""
