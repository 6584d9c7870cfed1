"""Planned per-rank batches inside the trainers people run: Ultralytics (``planner.integrations.ultralytics``).

Each integration imports its library only when used: importing this package imports none of them.
"""
