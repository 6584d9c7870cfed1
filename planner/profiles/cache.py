"""On-disk cache of device profiles, one JSON file per content key.

An entry records its schema version, what its key is made of (the workload fingerprint, input, amp,
optimizer, GPU type, method, fit and torch version: ``planner.profiles.key.job_key_inputs``), and a SHA-256
checksum of the profile it holds. The checksum only catches accidents (anyone can recompute a plain hash),
so an entry is trusted only when, besides parsing strictly within size and nesting limits:

- its key, recomputed from the inputs it records, is its file's key, and the profile's GPU type, method and
  amp are those inputs' (a T4 profile filed under an A100's key is refused);
- its profile is physically possible (``planner.profiles.checks``: positive finite points, memory growing
  with the batch, ``oom_batch`` above a batch that fitted) and possible on its GPU (a catalog type: no step
  faster than the card's bandwidth allows, no memory below the weights the entry lists);
- its directory is writable by this user and no other (``check_directory``).

An entry failing any of these is reported (a warning in the plan and on stderr), ignored, and rewritten by
the fresh profile. An entry that passes them is possible, not proven right (a plausible forgery passes):
``--verify-cache`` holds it against a fresh estimate (``planner.profiling.verify``). Writes are atomic (temporary file + rename), so a crash or two planners writing at once
cannot leave a half-written entry. A cache directory that is a regular file is a ConfigError before any
work; a directory where an entry's file should be is a problem when read and a ConfigError when the fresh
profile is written: nothing can be cached there until the user moves it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path

from planner.codec import convert, encode
from planner.errors import ConfigError, FieldError
from planner.files import write_file_safely
from planner.jsonio import read_json_file
from planner.profiles.checks import check_against_gpu, check_profile
from planner.profiles.key import key_of_inputs
from planner.profiles.measured import MEASURED_METHOD, MEASURED_SCHEME
from planner.profiles.profile import DeviceProfile

log = logging.getLogger(__name__)

#: @2: entries record their key's inputs (entries of @1 are re-profiled once)
CACHE_SCHEMA = "batchplan/profile-cache@2"
#: largest entry read: a profile is a few KiB (points, fits, notes)
MAX_ENTRY_BYTES = 4 * 2**20


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
        self._directory_checked = False

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def check_directory(self, what: str = "the profile cache directory") -> None:
        """The cache directory is a directory or can become one (no regular file or dangling link on its path);
        if it exists, this process can write it and no other user can (``_check_trusted_directory``)."""
        for path in (self.directory, *self.directory.parents):
            if path.is_symlink() and not path.exists():
                raise FieldError(
                    "cache_dir", f"{what} {self.directory} is not a directory ({path} is a symbolic link to "
                    f"{os.readlink(path)}, which does not exist; create it, or choose another `cache_dir`)"
                )
            if path.exists():
                if not path.is_dir():
                    raise FieldError(
                        "cache_dir", f"{what} {self.directory} is not a directory ({path} is a file; choose another "
                        "`cache_dir` or remove the file)"
                    )
                if path == self.directory:
                    _check_trusted_directory(path, what)
                return

    def get(self, key: str) -> DeviceProfile | None:
        """The cached profile, or None if absent or not to be trusted (then noted in ``problems``).

        A directory where the entry's file should be is a problem here, and an error when ``put`` writes.
        """
        path = self.path_for(key)
        if not path.exists():
            return None
        if not self._directory_checked:  # no entry is read from a directory others may write
            self.check_directory()
            self._directory_checked = True
        try:
            entry = read_json_file(path, what="entry", max_bytes=MAX_ENTRY_BYTES, fix="it will be profiled again")
            return _trusted_profile(entry, key, str(path))
        except (ConfigError, ValueError, KeyError, TypeError, AttributeError) as exc:
            message = f"profile cache entry {path} is corrupt ({exc}); ignoring it and profiling again"
            log.warning(message)
            self.problems.append(message)
            return None

    def put(self, key: str, profile: DeviceProfile, *, inputs: dict[str, str]) -> Path:
        """Store ``profile`` under ``key``, with the ``inputs`` the key was made from."""
        if key_of_inputs(inputs) != key:
            raise ValueError(f"key {key} is not the key of its inputs {inputs}")  # our own invariant
        profile_json = encode(profile)
        entry = {"schema": CACHE_SCHEMA, "key": key, "inputs": dict(inputs), "checksum": _checksum(profile_json),
                 "profile": profile_json}
        self.check_directory()
        fix = "choose another --cache-dir, or --no-cache"  # an OSError's text may hold backticks: plain words
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o755)  # never o+w, whatever the umask
        except OSError as exc:
            raise ConfigError(f"cannot create the profile cache directory {self.directory}: {exc.strerror or exc} "
                              f"({fix})") from None
        path = self.path_for(key)
        if path.is_dir():
            raise FieldError("cache_dir",
                             f"profile cache entry {path} is a directory (remove it, or choose another `cache_dir`)")
        write_file_safely(path, json.dumps(entry, indent=1), what="the profile cache entry", fix=fix, mode=0o644)
        return path


def _check_trusted_directory(directory: Path, what: str) -> None:
    """Refuse a cache directory that others may write or this process may not.

    An entry's name is its key, which anyone can compute, and its checksum anyone can recompute: whoever can
    write the directory decides the plans (``checks.py`` rejects the impossible, not the merely wrong). So a
    directory writable by every user (``/tmp``, mode ``o+w``) is refused, sticky bit or not. A directory this
    process cannot write fails here, before any work, rather than after the profiling it was to store.
    """
    mode = directory.stat().st_mode
    if mode & stat.S_IWOTH:
        raise FieldError(
            "cache_dir", f"{what} {directory} is writable by every user (mode {stat.filemode(mode)}): anyone could "
            f"plant profiles there (chmod o-w {directory}, or choose another `cache_dir`)"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise FieldError(
            "cache_dir", f"{what} {directory} is not writable by this user (choose another `cache_dir`, or `no_cache`)"
        )


def _trusted_profile(entry: object, key: str, where: str) -> DeviceProfile:
    """The profile of a parsed entry, if every rule of the module docstring holds; else ValueError/ConfigError."""
    if not isinstance(entry, dict):
        raise ValueError(f"entry is not a JSON object but a {type(entry).__name__}")
    if entry.get("schema") != CACHE_SCHEMA:
        raise ValueError(f"schema {entry.get('schema')!r} is not {CACHE_SCHEMA!r}")
    if entry.get("key") != key:
        raise ValueError(f"entry is for key {entry.get('key')!r}")
    if entry.get("checksum") != _checksum(entry["profile"]):
        raise ValueError("checksum mismatch")
    inputs = entry.get("inputs")
    if not isinstance(inputs, dict) or not all(isinstance(v, str) for v in inputs.values()):
        raise ValueError("entry does not record what its key is made of")
    if key_of_inputs(inputs) != key:
        raise ValueError(f"its key recomputed from its own inputs is {key_of_inputs(inputs)}, not {key}")
    profile = convert(DeviceProfile, entry["profile"], where="profile")
    check_profile(profile, "profile")
    # a measured-in-job key names no method: its profiles are all of method "job"
    method = MEASURED_METHOD if inputs.get("scheme") == MEASURED_SCHEME else inputs.get("method")
    for field, wanted, value in (("gpu", inputs.get("gpu"), profile.gpu), ("method", method, profile.method),
                                 ("amp", inputs.get("amp"), profile.amp)):
        if wanted != value:
            raise ValueError(f"its profile is for {field} {value!r} but its key is for {wanted!r}")
    gpu = _shipped_gpu(profile.gpu)
    if gpu is not None:  # a type a config adds is not known here: its entries get the checks above only
        check_against_gpu(profile, gpu, "profile")
    return profile


def _shipped_gpu(name: str):
    """The shipped catalog's entry for ``name``, or None."""
    from torchkit.hardware.catalog import load_catalog

    return load_catalog().resolve(name)
