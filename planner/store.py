"""The cache directory, one store: every entry batchplan keeps there (device profiles, measured networks, gradient
layouts, measured synchronisation) is read and written here, each kind a :class:`Namespace`.

Every entry is a file ``<directory>/<namespace folder>/<key>.json``, written atomically (``planner.files``) as::

    {"schema": "batchplan/<kind>-cache@N", "key": ..., "inputs": {what the key is made of},
     "checksum": SHA-256 of the payload's canonical JSON, "<payload>": the value, a record of its namespace}

and read back through the codec (``planner.codec``: strict JSON, every field of its type) under one size cap
(:data:`MAX_ENTRY_BYTES`, checked by ``stat`` before a byte is read). An entry is trusted only when its schema
is its namespace's, its key recomputed from the inputs it records is its file's name, its checksum is its
payload's, and its namespace's own check passes (a profile must be physically possible and of the GPU, method
and AMP mode its key names: ``planner.profiles.cache``). The checksum only catches accidents (anyone can
recompute a plain hash), so who could have written an entry is the question (``planner.trust``, OpenSSH's
``StrictModes``): the entry must be a regular file owned by this user or root and writable by no one else, and
its directory and every one above it owned by this user or root and writable by no one else (above it: or
sticky), each checked on its open descriptor. An entry others could write is ignored, reported and derived
again; a cache directory others could write is one error line before any work (:meth:`CacheStore.
check_directory`). An entry failing any rule is reported (``problems``: a plan's warnings and stderr),
ignored, and replaced by the next ``write``; a directory where an entry's file should be is an error when the
entry is written.

The release before this store wrote the entries of three namespaces bare (the payload alone: measured networks,
gradient layouts; the measured synchronisation with its inputs); a namespace that names its legacy form reads
them as they are, and writes them anew when it next stores.

Pure Python: no torch, Ray or pynvml.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

from planner.codec import Meta, convert, encode
from planner.errors import ConfigError, FieldError
from planner.jsonio import check_tree, loads_strict
from planner.trust import UntrustedPathError, make_trusted_dir, read_trusted, trusted_dir, write_trusted

__all__ = [
    "MAX_ENTRY_BYTES",
    "UNTRUSTED_CACHE_FIX",
    "CacheStore",
    "Namespace",
    "default_cache_dir",
    "untrusted_cache_dir",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: largest entry read, of any namespace: a profile is a few KiB, a gradient layout of a thousand tensors 10 KiB
MAX_ENTRY_BYTES = 4 * 2**20
#: what a user does about a cache that cannot be written (an OSError's text may hold backticks: plain words)
WRITE_FIX = "choose another --cache-dir, or --no-cache"
#: the fix of an untrusted cache directory (``cache_dir``, ``no_cache``: rendered as the front end's flags)
UNTRUSTED_CACHE_FIX = (
    "chown it to this user and chmod go-w it, or use a directory of your own with `cache_dir` "
    "(under sudo: sudo -H, so that HOME is root's), or `no_cache`"
)


def untrusted_cache_dir(exc: UntrustedPathError) -> FieldError:
    """An untrusted directory on a cache's path (``planner.trust``) as the error it is for a user: one line, the
    directory at fault, the fix with the front end's flag names (``cache_dir``, ``no_cache``)."""
    return FieldError("cache_dir", f"{exc.problem.replace('`', chr(39))} ({UNTRUSTED_CACHE_FIX})")


def default_cache_dir() -> Path:
    """``$BATCHPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/batchplan/profiles``, else ``~/.cache/batchplan/profiles``."""
    if os.environ.get("BATCHPLAN_CACHE_DIR"):
        return Path(os.environ["BATCHPLAN_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "batchplan" / "profiles"


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """What every entry holds besides its payload."""

    schema: str
    key: str
    inputs: dict[str, str]
    """the named parts its key is made of"""
    checksum: Annotated[str, Meta(pattern=r"\A[0-9a-f]{64}\Z", description="be a SHA-256 in hex")]


@dataclass(frozen=True, kw_only=True)
class Namespace(Generic[T]):
    """One kind of entry in the store."""

    what: str
    """how messages name an entry (``profile cache entry``)"""
    folder: str
    """its folder in the cache directory ("" for the top, where the profiles have always been)"""
    schema: str
    payload: str
    """the key its value is under (``profile``)"""
    value_type: Any
    """the value's record (or annotation), read through the codec"""
    key_of: Callable[[Mapping[str, str]], str]
    """the key of the inputs an entry records"""
    redo: str
    """what happens instead of using a refused entry (``profiling again``)"""
    check: Callable[[T, Mapping[str, str]], None] | None = None
    """the namespace's own rules for a value against its key's inputs; raises ConfigError or ValueError"""
    legacy: Callable[[Any, str], tuple[T, Mapping[str, str] | None]] | None = None
    """reads an entry the previous release wrote bare (no ``schema``) into (value, the inputs it records, if
    it records any); raises ConfigError where it is not one"""


def checksum(data: Any) -> str:
    """SHA-256 of the canonical JSON of ``data`` (sorted keys, no spaces): what an entry's ``checksum`` is."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class CacheStore:
    """The entries of every namespace in ``directory``; ``problems`` lists the entries refused so far."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        # absolute now: user code run later (a factory's os.chdir) must not move the cache
        self.directory = Path(os.path.abspath(directory if directory is not None else default_cache_dir()))
        self.problems: list[str] = []
        self._checked: set[Path] = set()

    def path(self, namespace: Namespace[Any], key: str) -> Path:
        return self.directory / namespace.folder / f"{key}.json"

    def check_directory(self, what: str = "the profile cache directory") -> None:
        """The cache directory is a directory or can become one (no regular file or dangling link on its path),
        no other user could write it or a directory above it (``planner.trust``), and this process can write it.

        Raises:
            FieldError: (``cache_dir``) one line naming the directory at fault and the fix.
        """
        for path in (self.directory, *self.directory.parents):
            if path.is_symlink() and not path.exists():
                raise FieldError(
                    "cache_dir",
                    f"{what} {self.directory} is not a directory ({path} is a symbolic link to "
                    f"{os.readlink(path)}, which does not exist; create it, or choose another `cache_dir`)",
                )
            if path.exists():
                if not path.is_dir():
                    raise FieldError(
                        "cache_dir",
                        f"{what} {self.directory} is not a directory ({path} is a file; choose another "
                        "`cache_dir` or remove the file)",
                    )
                break
        try:
            trusted_dir(self.directory, what=what, fix=UNTRUSTED_CACHE_FIX)
        except UntrustedPathError as exc:
            raise untrusted_cache_dir(exc) from None
        if self.directory.exists() and not os.access(self.directory, os.W_OK | os.X_OK):
            raise FieldError(
                "cache_dir",
                f"{what} {self.directory} is not writable by this user (choose another `cache_dir`, or "
                "`no_cache`)",
            )

    def read(self, namespace: Namespace[T], key: str) -> T | None:
        """The value under ``key``, or None where there is none or it is refused (then said in ``problems``):
        corrupt, or where another user could have written it (``planner.trust``).

        Raises:
            FieldError: (``cache_dir``) the cache directory, or one above it, is not trusted.
        """
        path = self.path(namespace, key)
        try:
            self._check_folder(namespace)
            return self._read(namespace, key, path)
        except FieldError:
            raise
        except UntrustedPathError as exc:
            if exc.in_directory:
                raise untrusted_cache_dir(exc) from None
            # the entry alone: another user's, a link, or writable by others
            message = f"{exc.problem}: not trusted; ignoring it and {namespace.redo}"
        except (ConfigError, ValueError) as exc:
            message = f"{namespace.what} {path} is corrupt ({exc}); ignoring it and {namespace.redo}"
        log.warning(message)
        self.problems.append(message)
        return None

    def write(self, namespace: Namespace[T], inputs: Mapping[str, str], value: T) -> Path:
        """Store ``value`` under the key of ``inputs``, with them; returns the entry's path.

        Raises:
            FieldError: the directory cannot hold it (another user may write it; a directory at the entry's path).
            ConfigError: it cannot be written (nothing is left half-written).
        """
        key = namespace.key_of(inputs)
        data = encode(value)
        entry = {
            "schema": namespace.schema,
            "key": key,
            "inputs": dict(inputs),
            "checksum": checksum(data),
            namespace.payload: data,
        }
        self.check_directory()
        folder = self.directory / namespace.folder
        path = self.path(namespace, key)
        try:
            make_trusted_dir(
                folder, what="the cache directory", fix=WRITE_FIX
            )  # never o+w, whatever the umask
            if path.is_dir() and not path.is_symlink():
                raise FieldError(
                    "cache_dir",
                    f"{namespace.what} {path} is a directory (remove it, or choose another `cache_dir`)",
                )
            # a symbolic link at the entry's path is replaced, never written through
            return write_trusted(
                path, json.dumps(entry, indent=1), what=f"the {namespace.what}", fix=WRITE_FIX
            )
        except UntrustedPathError as exc:
            raise untrusted_cache_dir(exc) from None

    def _check_folder(self, namespace: Namespace[Any]) -> None:
        """No entry is read from a directory others may write: the store's, and the namespace's folder (each
        read checks them again on its descriptors: ``planner.trust.read_trusted``; this says it once, first)."""
        folder = self.directory / namespace.folder
        if folder in self._checked:
            return
        self.check_directory()
        if folder != self.directory:
            trusted_dir(
                folder, what=f"the {namespace.what.removesuffix(' entry')} directory", fix=UNTRUSTED_CACHE_FIX
            )
        self._checked.add(folder)

    def _read(self, namespace: Namespace[T], key: str, path: Path) -> T | None:
        """The value of the entry at ``path``, every rule of the module docstring held (else ConfigError)."""
        fix = namespace.redo
        raw = read_trusted(path, what=namespace.what, fix=fix, max_bytes=MAX_ENTRY_BYTES)
        if raw is None:
            return None
        document = loads_strict(raw, source="the entry", fix=fix)
        # no control character in any string: a profile's note holding ESC made every later plan unwritable
        check_tree(document, "the entry")
        if isinstance(document, dict) and "schema" not in document and namespace.legacy is not None:
            value, inputs = namespace.legacy(document, "the entry")
        else:
            value, inputs = self._enveloped(namespace, document, key)
        if inputs is not None and namespace.key_of(inputs) != key:
            raise ConfigError(
                f"its key recomputed from its own inputs is {namespace.key_of(inputs)}, not {key}"
            )
        if namespace.check is not None:
            namespace.check(value, inputs or {})
        return value

    @staticmethod
    def _enveloped(namespace: Namespace[T], document: Any, key: str) -> tuple[T, Mapping[str, str]]:
        if not isinstance(document, dict):
            raise ConfigError(f"it is not a JSON object but a {type(document).__name__}")
        if document.get("schema") != namespace.schema:
            raise ConfigError(f"schema {document.get('schema')!r} is not {namespace.schema!r}")
        if namespace.payload not in document:
            raise ConfigError(f"it lacks the field '{namespace.payload}'")
        payload = document[namespace.payload]
        envelope = convert(
            Envelope, {k: v for k, v in document.items() if k != namespace.payload}, where="the entry"
        )
        if envelope.key != key:
            raise ConfigError(f"entry is for key {envelope.key!r}")
        if envelope.checksum != checksum(payload):
            raise ConfigError("checksum mismatch")
        return convert(namespace.value_type, payload, where=namespace.payload), envelope.inputs
