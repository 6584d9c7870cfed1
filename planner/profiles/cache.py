"""On-disk cache of device profiles, one JSON file per content key.

An entry records its schema version, what its key is made of (the workload fingerprint, input, amp,
optimizer, GPU type, method, fit and torch version: ``planner.profiles.key.job_key_inputs``), and a SHA-256
checksum of the profile it holds. The checksum only catches accidents (anyone can recompute a plain hash),
so an entry is trusted only when, besides parsing strictly within size and nesting limits:

- its key, recomputed from the inputs it records, is its file's key, and the profile's GPU type, method and
  amp are those inputs' (a T4 profile filed under an A100's key is refused);
- its profile is physically possible (``planner.profiles.checks``: positive finite points, memory growing
  with the batch, fits that are the fits of its points, ``oom_batch`` above a batch that fitted), and no string
  in it holds a control character (a note with ESC in it would make every plan that carries it unwritable) and possible on its GPU (a catalog type: no step
  faster than the card's bandwidth allows, no memory below the weights the entry lists);
- no other user could have written it (``planner.trust``, OpenSSH's ``StrictModes``): the entry is a regular
  file owned by this user or root and writable by no one else, checked on the open descriptor; its directory
  and every one above it are owned by this user or root and writable by no one else (above it: or sticky).

An entry failing any of these is reported (a warning in the plan and on stderr), ignored, and rewritten by
the fresh profile. A cache directory that fails the last rule is refused before any work, in one line naming
the directory at fault and the fix (``check_directory``): another user's ``--cache-dir``, a group-writable one,
one under a directory others can write, another user's ``HOME`` under ``sudo`` without ``-H``. An entry that passes them is possible, not proven right (a plausible forgery passes):
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
from pathlib import Path

from planner.errors import ConfigError, FieldError
from planner.jsonio import check_tree, loads_strict
from planner.profiles.checks import check_against_gpu, checked_profile
from planner.profiles.key import key_of_inputs
from planner.profiles.measured import MEASURED_METHOD, MEASURED_SCHEME
from planner.profiles.profile import DeviceProfile
from planner.trust import UntrustedPathError, read_trusted, trusted_dir, write_trusted

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
        # absolute now: user code run later (a factory's os.chdir) must not move the cache
        self.directory = Path(os.path.abspath(directory if directory is not None else default_cache_dir()))
        self.problems: list[str] = []
        self._directory_checked = False

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def check_directory(self, what: str = "the profile cache directory") -> None:
        """The cache directory is a directory or can become one (no regular file or dangling link on its path),
        no other user could write it or a directory above it (``planner.trust``), and this process can write it.

        Raises:
            FieldError: (``cache_dir``) one line naming the directory at fault and the fix.
        """
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
                break
        try:
            trusted_dir(self.directory, what=what, fix=UNTRUSTED_CACHE_FIX)
        except UntrustedPathError as exc:
            raise untrusted_cache_dir(exc) from None
        if self.directory.exists() and not os.access(self.directory, os.W_OK | os.X_OK):
            raise FieldError(
                "cache_dir", f"{what} {self.directory} is not writable by this user (choose another `cache_dir`, or "
                "`no_cache`)"
            )

    def get(self, key: str) -> DeviceProfile | None:
        """The cached profile, or None if absent or not to be trusted (then noted in ``problems``).

        A directory where the entry's file should be is a problem here, and an error when ``put`` writes.

        Raises:
            FieldError: (``cache_dir``) the cache directory, or one above it, is not trusted (``planner.trust``).
        """
        path = self.path_for(key)
        if not self._directory_checked:  # no entry is read from a directory others may write
            self.check_directory()
            self._directory_checked = True
        try:
            raw = read_trusted(path, what="profile cache entry", fix="it will be profiled again",
                               max_bytes=MAX_ENTRY_BYTES)
            if raw is None:
                return None
            entry = loads_strict(raw, source=f"entry {path}", fix="it will be profiled again")
            # no control character in any string: a note holding ESC made every later plan unwritable
            check_tree(entry, f"entry {path}")
            return _trusted_profile(entry, key, str(path))
        except UntrustedPathError as exc:
            if exc.in_directory:
                raise untrusted_cache_dir(exc) from None
            # the entry alone: another user's, or writable by others
            message = f"{exc.problem}: not trusted; ignoring it and profiling again (the fresh profile replaces it)"
        except (ConfigError, ValueError, KeyError, TypeError, AttributeError) as exc:
            message = f"profile cache entry {path} is corrupt ({exc}); ignoring it and profiling again"
        log.warning(message)
        self.problems.append(message)
        return None

    def put(self, key: str, profile: DeviceProfile, *, inputs: dict[str, str]) -> Path:
        """Store ``profile`` under ``key``, with the ``inputs`` the key was made from; an entry that is a
        symbolic link is replaced, never written through."""
        if key_of_inputs(inputs) != key:
            raise ValueError(f"key {key} is not the key of its inputs {inputs}")  # our own invariant
        profile_json = profile.to_json()
        entry = {"schema": CACHE_SCHEMA, "key": key, "inputs": dict(inputs), "checksum": _checksum(profile_json),
                 "profile": profile_json}
        self.check_directory()
        fix = "choose another --cache-dir, or --no-cache"  # an OSError's text may hold backticks: plain words
        path = self.path_for(key)
        if path.is_dir() and not path.is_symlink():
            raise FieldError("cache_dir",
                             f"profile cache entry {path} is a directory (remove it, or choose another `cache_dir`)")
        try:
            write_trusted(path, json.dumps(entry, indent=1), what="the profile cache entry", fix=fix)
        except UntrustedPathError as exc:
            raise untrusted_cache_dir(exc) from None
        return path


#: the fix of an untrusted cache directory (``cache_dir``, ``no_cache``: rendered as the front end's flags)
UNTRUSTED_CACHE_FIX = ("chown it to this user and chmod go-w it, or use a directory of your own with `cache_dir` "
                       "(under sudo: sudo -H, so that HOME is root's), or `no_cache`")


def untrusted_cache_dir(exc: UntrustedPathError) -> FieldError:
    """An untrusted directory on a cache's path (``planner.trust``) as the error it is for a user: one line, the
    directory at fault, the fix with the front end's flag names (``cache_dir``, ``no_cache``)."""
    return FieldError("cache_dir", f"{exc.problem.replace('`', chr(39))} ({UNTRUSTED_CACHE_FIX})")


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
    profile = checked_profile(entry["profile"], "profile")
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
