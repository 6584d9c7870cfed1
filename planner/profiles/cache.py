"""Device profiles in the cache directory: the namespace of the one store (``planner.store``) that has always
held them, one entry per content key (``planner.profiles.key``) at the top of the cache directory
(``batchplan/profile-cache@2``, the profile under ``profile``).

Besides the store's rules (schema, key recomputed from the inputs the entry records, checksum, size), a profile
entry is trusted only when its profile's GPU type, method and AMP mode are its key's (a T4 profile filed under
an A100's key is refused), it is physically possible (``planner.profiles.checks``: positive finite points,
memory growing with the batch, ``oom_batch`` above a batch that fitted) and possible on its GPU where the
catalog knows it (no step faster than the card's bandwidth allows, no memory below the weights the entry lists).
An entry that passes them is possible, not proven right (a plausible forgery passes): ``--verify-cache`` holds
it against a fresh estimate (``planner.obtain.verify``). Entries of ``@1`` are re-profiled once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from planner.profiles.checks import check_against_gpu, check_profile
from planner.profiles.key import key_of_inputs
from planner.profiles.measured import MEASURED_METHOD, MEASURED_SCHEME
from planner.profiles.profile import DeviceProfile
from planner.store import MAX_ENTRY_BYTES, CacheStore, Namespace, default_cache_dir

__all__ = ["CACHE_SCHEMA", "MAX_ENTRY_BYTES", "PROFILES", "ProfileCache", "default_cache_dir"]

#: @2: entries record their key's inputs (entries of @1 are re-profiled once)
CACHE_SCHEMA = "batchplan/profile-cache@2"


def _check(profile: DeviceProfile, inputs: Mapping[str, str]) -> None:
    """A profile entry's own rules (module docstring)."""
    check_profile(profile, "profile")
    method = MEASURED_METHOD if inputs.get("scheme") == MEASURED_SCHEME else inputs.get("method")
    for field, wanted, value in (
        ("gpu", inputs.get("gpu"), profile.gpu),
        ("method", method, profile.method),
        ("amp", inputs.get("amp"), profile.amp),
    ):
        if wanted != value:
            raise ValueError(f"its profile is for {field} {value!r} but its key is for {wanted!r}")
    from torchkit.hardware.catalog import load_catalog

    gpu = load_catalog().resolve(profile.gpu)
    if gpu is not None:  # a type a config adds is not known here: its entries get the checks above only
        check_against_gpu(profile, gpu, "profile")


PROFILES: Namespace[DeviceProfile] = Namespace(
    what="profile cache entry",
    folder="",
    schema=CACHE_SCHEMA,
    payload="profile",
    value_type=DeviceProfile,
    key_of=key_of_inputs,
    redo="profiling again",
    check=_check,
)


class ProfileCache(CacheStore):
    """The store, with the profiles' namespace at hand: ``get(key)``, ``put(key, profile, inputs=...)``."""

    def path_for(self, key: str) -> Path:
        return self.path(PROFILES, key)

    def get(self, key: str) -> DeviceProfile | None:
        """The cached profile, or None if absent or not to be trusted (then noted in ``problems``)."""
        return self.read(PROFILES, key)

    def put(self, key: str, profile: DeviceProfile, *, inputs: Mapping[str, str]) -> Path:
        """Store ``profile`` under ``key``, with the ``inputs`` the key was made from."""
        if key_of_inputs(dict(inputs)) != key:
            raise ValueError(f"key {key} is not the key of its inputs {inputs}")  # our own invariant
        return self.write(PROFILES, inputs, profile)
