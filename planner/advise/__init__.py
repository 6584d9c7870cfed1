"""``batchplan advise``: which GPUs to rent for a job. Offers (``offers``), the candidate clusters they allow
(``candidates``), and the search that plans each with the ``plan`` machinery and keeps the Pareto front of
cost per epoch against time per epoch (``search``, ``front``)."""
