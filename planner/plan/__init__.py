"""Stage 4 of planning: the plan. ``build`` turns an allocation into a plan; ``types`` holds its typed parts;
``launch`` the launch lines; ``io`` reads, validates and writes ``plan.json`` (schema ``batchplan/plan@1``)."""
