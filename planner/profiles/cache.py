"""On-disk cache of device profiles, one JSON file per content key.

An entry records its schema version and a SHA-256 checksum of the profile it holds. A file that does not
parse, has another schema, or whose checksum does not match is never trusted: it is reported, ignored and
rewritten by the next profile of that key. Writes are atomic (temporary file + rename), so a crash or two
planners writing at once cannot leave a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from planner.profiles.profile import DeviceProfile

log = logging.getLogger(__name__)

CACHE_SCHEMA = "batchplan/profile-cache@1"


def default_cache_dir() -> Path:
    """``$BATCHPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/batchplan/profiles``, else ``~/.cache/batchplan/profiles``."""
    if os.environ.get("BATCHPLAN_CACHE_DIR"):
        return Path(os.environ["BATCHPLAN_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "batchplan" / "profiles"


def _checksum(profile_json: dict) -> str:
    return hashlib.sha256(json.dumps(profile_json, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ProfileCache:
    """Profiles by content key in ``directory``; ``problems`` lists the entries found corrupt."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.problems: list[str] = []

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> DeviceProfile | None:
        """The cached profile, or None if absent or not to be trusted (then noted in ``problems``)."""
        path = self.path_for(key)
        if not path.exists():
            return None
        try:
            entry = json.loads(path.read_text())
            if entry.get("schema") != CACHE_SCHEMA:
                raise ValueError(f"schema {entry.get('schema')!r} is not {CACHE_SCHEMA!r}")
            if entry.get("key") != key:
                raise ValueError(f"entry is for key {entry.get('key')!r}")
            if entry.get("checksum") != _checksum(entry["profile"]):
                raise ValueError("checksum mismatch")
            return DeviceProfile.from_json(entry["profile"], where=str(path))
        except Exception as exc:  # any defect means: do not trust, re-profile, overwrite
            message = f"profile cache entry {path} is corrupt ({exc}); ignoring it and profiling again"
            log.warning(message)
            self.problems.append(message)
            return None

    def put(self, key: str, profile: DeviceProfile) -> Path:
        profile_json = profile.to_json()
        entry = {"schema": CACHE_SCHEMA, "key": key, "checksum": _checksum(profile_json), "profile": profile_json}
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(key)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(entry, handle, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
