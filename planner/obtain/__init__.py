"""Obtaining what a plan is made from: which profile, made how, cached where, and the model's gradient layout;
the one layer the driver, ``batchplan profile`` and the running job (``planner.runtime.autobatch_ddp``) obtain
device profiles through (the data they obtain is ``planner.profiles``'s; where things run, ``planner.probing``'s).

- ``request``: ``ProfileRequest`` (job, GPU type, ``Method``, device) and ``Profiled`` (the profile, its
  ``ProfileOrigin`` — cached, made, measured in the job — its key and notes);
- ``method``: ``resolve_method``, the one meaning of ``auto``, decided where the GPU is;
- ``lookup``: ``obtain_profile``, key inputs → key → cache.get → make → cache.put, once;
- ``make``: ``make_profile``, estimating or measuring in this process (a probe, the CLI, a rank);
- ``verify``: ``--verify-cache``, a cached profile held against a fresh estimate;
- ``time_limit``: how long a user's ``module:factory`` may take, in the driver and in each probe;
- ``gradients``: the bytes of each parameter's gradient (the model on the meta device), kept in the store.
"""

from planner.obtain.lookup import obtain_profile, planned_key, profile_key_inputs
from planner.obtain.make import job_fingerprint, make_profile
from planner.obtain.method import Method, ResolvedMethod, planned_method, resolve_method
from planner.obtain.request import Profiled, ProfileOrigin, ProfileRequest

__all__ = [
    "Method",
    "ProfileOrigin",
    "ProfileRequest",
    "Profiled",
    "ResolvedMethod",
    "job_fingerprint",
    "make_profile",
    "obtain_profile",
    "planned_key",
    "planned_method",
    "profile_key_inputs",
    "resolve_method",
]
