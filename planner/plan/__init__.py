"""Stage 4 of planning: the plan. ``build`` turns an allocation into a plan; ``types`` holds its typed parts and
``derived`` the figures and identities computed from them; ``launch`` the launch lines; ``validate`` the one
validator; ``io`` reads and writes ``plan.json`` (schema ``batchplan/plan@1``), laid out by ``layout`` with
the index beside it by which ``rank_view`` reads one rank's part."""
