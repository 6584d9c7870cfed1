"""Which profile, made how, cached where: the one layer the driver, ``batchplan profile`` and the running job
(``planner.runtime.autobatch_ddp``) obtain device profiles through.

- ``request``: ``ProfileRequest`` (job, GPU type, ``Method``, device) and ``Profiled`` (the profile, its
  ``ProfileOrigin`` — cached, made, measured in the job — its key and notes);
- ``method``: ``resolve_method``, the one meaning of ``auto``, decided where the GPU is;
- ``obtain``: ``obtain_profile``, key inputs → key → cache.get → make → cache.put, once;
- ``make``: ``make_profile``, estimating or measuring in this process (a probe, the CLI, a rank).

``planner.probing`` says only where things run (Ray, actors, sessions); ``planner.profiles`` is the data
(profile, key, cache files).
"""

from planner.profiling.make import job_fingerprint, make_profile
from planner.profiling.method import Method, ResolvedMethod, planned_method, resolve_method
from planner.profiling.obtain import obtain_profile, planned_key, profile_key_inputs
from planner.profiling.request import Profiled, ProfileOrigin, ProfileRequest

__all__ = [
    "Method", "ProfileOrigin", "ProfileRequest", "Profiled", "ResolvedMethod", "job_fingerprint", "make_profile",
    "obtain_profile", "planned_key", "planned_method", "profile_key_inputs", "resolve_method",
]
