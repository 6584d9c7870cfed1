"""Ray's token authentication when joining a cluster (``--address``, or a cluster found running here).

Ray 2.52+ can require a bearer token on every GCS and raylet RPC (``RAY_AUTH_MODE=token``); ``ray start
--head`` turns it on by itself where a token file already exists (``~/.ray/auth_token``, which any local
``ray.init()`` of Ray 2.59+ creates), and Ray 2.61 turns it on for every cluster. A driver sends its token
only when *its* ``RAY_AUTH_MODE`` is ``token``; ``ray.init`` switches that on by itself only for
``address="auto"``, so a driver given ``HOST:PORT`` (what a second node types) retries ``InvalidAuthToken``
for about 20 s and then reports an unreachable cluster.

:func:`prepare_join_auth` asks the cluster once, in about a second, whether it accepts this driver: with no
token sent where the mode is unset, and, if the cluster wants one and one is found here (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``: Ray's own order), again with it, turning token mode on
for this process as ``ray.init("auto")`` would. A cluster that wants a token none of which is found, or
rejects the one found, is one error line that says what to do.

Known limitations: ``ray://`` (Ray Client) addresses are left to Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from planner.errors import ClusterUnreachableError

log = logging.getLogger(__name__)

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
#: how long the one authentication question to the GCS may take (an answer comes in about a second)
AUTH_PROBE_TIMEOUT_MS = 3000
TOKEN_AUTH_DOCS = "https://docs.ray.io/en/latest/ray-security/token-auth.html"


def default_token_path() -> Path:
    """Where ``ray get-auth-token --generate`` and a local ``ray.init()`` keep the token (Ray 2.60:
    ``ray._private.authentication.authentication_token_setup._get_default_token_path``)."""
    return Path.home() / ".ray" / "auth_token"


def token_source() -> str | None:
    """Where a token would come from here, in Ray's order, or None when there is none."""
    if os.environ.get(TOKEN_VAR, "").strip():
        return TOKEN_VAR
    explicit = os.environ.get(TOKEN_PATH_VAR, "").strip()
    if explicit:
        return f"{TOKEN_PATH_VAR}={explicit}"
    path = default_token_path()
    try:
        if path.read_text().strip():
            return str(path)
    except OSError:
        return None
    return None


def missing_token_message(address: str) -> str:
    """The one line for a cluster that wants a token when none is found here."""
    return (
        f"the Ray cluster at {address!r} requires an authentication token (Ray token auth) and none was found "
        f"here (copy the head node's ~/.ray/auth_token to {default_token_path()} on this machine, or set "
        f"{TOKEN_VAR} to its contents or {TOKEN_PATH_VAR} to a file holding it; `ray get-auth-token` on the "
        f"head prints it; see {TOKEN_AUTH_DOCS})"
    )


def rejected_token_message(address: str, source: str) -> str:
    return (
        f"the Ray cluster at {address!r} rejected the authentication token from {source} (use the token the "
        f"cluster was started with: `ray get-auth-token` on the head node prints it; see {TOKEN_AUTH_DOCS})"
    )


def disabled_here_message(address: str) -> str:
    return (
        f"the Ray cluster at {address!r} requires an authentication token but {AUTH_MODE_VAR}=disabled here "
        f"(unset it or set {AUTH_MODE_VAR}=token, with the head node's token in {default_token_path()})"
    )


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Ray's C++ GCS client logs one warning line per failed attempt straight to file descriptor 2; while we
    ask our one question those lines are ours to explain, not the user's to read."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _accepts_this_driver(gcs_address: str) -> bool:
    """Whether the GCS at ``gcs_address`` answers this process with its current authentication settings
    (False only for an authentication refusal; any other failure is left to ``ray.init`` to report)."""
    from ray._raylet import InnerGcsClient
    from ray.exceptions import AuthenticationError

    try:
        with _quiet_native_stderr():
            InnerGcsClient.standalone(gcs_address, None, AUTH_PROBE_TIMEOUT_MS)
    except AuthenticationError:
        return False
    except Exception as exc:  # unreachable or too slow: ray.init retries and reports it in its own words
        log.debug("authentication check of %s inconclusive: %s", gcs_address, exc)
    return True


def _enable_token_mode() -> None:
    """Token mode for this process and the Ray processes it starts, as ``ray.init("auto")`` does."""
    from ray._raylet import AuthenticationTokenLoader, Config

    os.environ[AUTH_MODE_VAR] = "token"
    Config.initialize("")  # Ray caches the mode it read from the environment
    AuthenticationTokenLoader.instance().reset_cache()


def prepare_join_auth(address: str) -> None:
    """Make this process able to join the GCS at ``address`` (``host:port``) under its authentication, or
    raise one clear error.

    Raises:
        ClusterUnreachableError: the cluster wants a token and none is found here, or rejects the one found,
            or ``RAY_AUTH_MODE=disabled`` here.
    """
    if "://" in address or address == "auto":
        return
    if _accepts_this_driver(address):
        return
    mode = os.environ.get(AUTH_MODE_VAR, "").strip().lower()
    source = token_source()
    if mode == "disabled":
        raise ClusterUnreachableError(disabled_here_message(address))
    if source is None:
        raise ClusterUnreachableError(missing_token_message(address))
    if mode == "token":  # the token was sent already
        raise ClusterUnreachableError(rejected_token_message(address, source))
    _enable_token_mode()
    if not _accepts_this_driver(address):
        raise ClusterUnreachableError(rejected_token_message(address, source))
    log.info(
        "the Ray cluster at %s uses token authentication: joining with the token from %s", address, source
    )
