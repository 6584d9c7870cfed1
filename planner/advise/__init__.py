"""``batchplan advise``: which GPUs to rent for a job. Offers (``offers``), the candidate clusters they allow
(``candidates``), each priced with the ``plan`` machinery and bounded without it (``evaluate``), the search
that keeps the Pareto front of cost per epoch against time per epoch (``search``), and the front as a report
(``report``).
"""
