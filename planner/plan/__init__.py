"""Stage 4 of planning: the plan. ``types`` declares it (and ``sections`` its ``comm``, ``probing`` and
``measured`` sections) and ``derived`` the figures and identities computed from them; ``build`` turns an
allocation into a plan, with ``comm`` (the gradient synchronisation's ring and model) and ``launch`` (the
torchrun lines; ``slurm_launch`` the ``srun`` line); ``validate`` is the one validator; ``io`` reads and writes
``plan.json`` (schema ``batchplan/plan@1``), laid out by ``layout`` with the index beside it by which
``rank_view`` reads one rank's part.
"""
