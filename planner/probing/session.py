"""Connecting to Ray: join a cluster (``--address``), start a local simulated one (``--cluster FILE``), or an
embedded single-node Ray (neither).

A simulated cluster runs at most ``raylet_cap`` raylets (``DEFAULT_RAYLET_CAP``, 1; ``--raylet-cap`` or
``BATCHPLAN_RAYLET_CAP`` raise it up to one per simulated node), every raylet on 127.0.0.1 with the dashboard
off (Ray has no authentication of its own: CVE-2023-48022). Every Ray worker that imports torch costs a few
hundred MiB, so simulated nodes share raylets: they are dealt round-robin onto the raylets, and one probe
process answers for each group. A real cluster always gets one probe per node.

A Ray cluster already running on this machine (a user's ``ray start --head``, found as ``ray.init()`` finds
it: ``RAY_ADDRESS``, else the address file ``ray start`` leaves) is joined when neither ``--cluster`` nor
``--address`` is given, as ``--address auto`` would, only where this user may trust it
(``planner.probing.local_cluster``: never another user's, never through the file under ``sudo``), and a line on
stderr says which cluster it is and whose. Every address is asked one bounded question before ``ray.init``
(``planner.probing.gcs_probe``): a port that is not a Ray GCS is one error line within seconds. A simulated cluster is
started beside it on ports of its own, and that cluster's address is not written over the user's address
file (Ray's test ``Cluster`` would, and then delete it on shutdown).

Everything this module starts it stops again: on leaving the ``with`` block, on an exception and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from planner.errors import ClusterUnreachableError, ConfigError
from planner.probing.gcs_probe import GcsAnswer, ask_gcs, is_this_machine, listening_owner, split_host_port
from planner.probing.local_cluster import find_running_cluster, ray_address_file, ray_temp_root
from torchkit.terminal_text import printable

log = logging.getLogger(__name__)

#: raylets of a simulated cluster by default: planning needs one probe per node, not one raylet (a probe
#: process answers for the simulated nodes dealt to its raylet, and the plan is the same however many there
#: are), while each raylet with its agents and idle worker costs seconds of CPU to start on a small machine.
#: ``--raylet-cap``/``BATCHPLAN_RAYLET_CAP`` raise it for a one-raylet-per-node run (memory bounds it near 8).
DEFAULT_RAYLET_CAP = 1
#: object store per simulated raylet: probes exchange kilobytes, so the 150 MiB Cluster default is plenty
SIMULATED_OBJECT_STORE_BYTES = 80 * 2**20
LOOPBACK = "127.0.0.1"


def _keep_ray_on_loopback() -> None:
    """Make a Ray cluster started by this process bind and advertise 127.0.0.1 only.

    Ray replaces 127.0.0.1 with the machine's own address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    which it reads once, when ``ray`` is first imported (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``).
    The variable is set before that import and inherited by the raylets and workers this process starts; if
    ``ray`` was imported earlier, the constant it derived is corrected the same way. Only for clusters this
    process starts: a driver joining a remote cluster must advertise its real address.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and getattr(constants, "ENABLE_RAY_CLUSTER", False):
        constants.ENABLE_RAY_CLUSTER = False


def _join_address(address: str | None) -> tuple[str | None, str | None]:
    """(the address ``ray.init`` is given, the GCS ``host:port`` it names or None for ``ray://``) for
    ``--address`` (None: the cluster running here, if this user may trust it; ``auto``: the same, or an error),
    with a stderr line saying which cluster is joined and whose it is (``planner.probing.local_cluster``)."""
    if address is None or address == "auto":
        found = find_running_cluster(explicit=address == "auto")
        if found is None:
            if address == "auto":
                raise ClusterUnreachableError(
                    f"--address auto found no Ray cluster running here (RAY_ADDRESS is unset and "
                    f"{printable(ray_address_file())} names none that answers; start one with `ray start --head`, "
                    "or give --address HOST:PORT)"
                )
            return None, None
        log.info(
            "found a running Ray cluster at %s: joining it%s",
            printable(found.describe()),
            ""
            if address == "auto"
            else ", as --address auto would (give --cluster FILE to plan a simulated cluster instead)",
        )
        address = found.address
    elif "://" not in address:
        parts = split_host_port(address)
        owner = listening_owner(*parts) if parts is not None else None
        if owner is not None:
            log.info("joining the Ray cluster at %s (its GCS runs as %s)", printable(address), owner)
    return address, (None if "://" in address else address)


#: the longest socket path Ray puts under its temporary directory, less that directory and this process's pid (the
#: session is named after it: ``ray._private.node``): "/session_<date>_<time>_<microseconds>_<pid>/sockets/
#: plasma_store.N", ".N" for the second and later raylets of a simulated cluster
_RAY_SOCKET_SUFFIX_CHARS = len("/session_2026-12-06_06-53-32_037564_/sockets/plasma_store.9")
#: the longest path of a Unix socket (Linux ``sockaddr_un``: 108 bytes with the terminating zero)
_MAX_UNIX_SOCKET_PATH_BYTES = 107
#: free space Ray's temporary directory needs for a run's session files and logs (a planning run writes a few
#: MiB; a full one made Ray wait 60 s for a port file and end in a traceback)
MIN_RAY_TEMP_FREE_BYTES = 64 * 2**20


def check_ray_temp_dir() -> None:
    """Ray's temporary directory can hold the session of a Ray this process starts: its socket paths within the
    Unix limit (a ``TMPDIR`` of about 40 characters was a traceback), room for its files (a full one was a
    traceback after a minute), writable.

    Raises:
        ConfigError: one line naming the directory, the variable that chose it and the fix.
    """
    root, source = ray_temp_root()
    shown = printable(root)
    suffix = _RAY_SOCKET_SUFFIX_CHARS + len(str(os.getpid()))
    longest = len(os.fsencode(os.path.abspath(root))) + suffix
    if longest > _MAX_UNIX_SOCKET_PATH_BYTES:
        room = _MAX_UNIX_SOCKET_PATH_BYTES - suffix - len("/ray")
        raise ConfigError(
            f"Ray's temporary directory {shown} (from {source}) is too long: Ray's socket paths under it would be "
            f"{longest} bytes, over the {_MAX_UNIX_SOCKET_PATH_BYTES} a Unix socket allows (set RAY_TMPDIR to a "
            f"directory of at most {room} characters, e.g. RAY_TMPDIR=/tmp)"
        )
    existing = root
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    try:
        space = os.statvfs(existing)
    except OSError as exc:
        raise ConfigError(
            f"Ray's temporary directory {shown} (from {source}) cannot be used: {exc.strerror} (set "
            "RAY_TMPDIR to a writable directory)"
        ) from None
    free = space.f_bavail * space.f_frsize
    if free < MIN_RAY_TEMP_FREE_BYTES or (space.f_files and space.f_favail < 64):
        raise ConfigError(
            f"Ray's temporary directory {shown} (from {source}) has {free / 2**20:.1f} MiB and {space.f_favail} "
            f"inodes free: Ray needs {MIN_RAY_TEMP_FREE_BYTES // 2**20} MiB for its session files (free space there, "
            "or set RAY_TMPDIR to another directory)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"Ray's temporary directory {shown} (from {source}) is not writable by this user (set "
            "RAY_TMPDIR to a directory of yours)"
        )


def _already_connected() -> bool:
    """Whether this process is connected to Ray already (checked without importing Ray: the import fixes whether
    127.0.0.1 is kept, ``_keep_ray_on_loopback``)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@contextlib.contextmanager
def _own_cluster_only() -> Iterator[None]:
    """While Ray processes of our own start: ignore ``RAY_ADDRESS`` (Ray would join that cluster instead) and
    leave the user's address file alone (``ray.cluster_utils.Cluster`` writes its own address there, logs
    "Overwriting previous Ray address" and deletes the file on shutdown, so ``ray status`` would then miss
    the user's cluster)."""
    from ray._common import utils as ray_common_utils
    from ray._private import utils as ray_utils

    saved_address = os.environ.pop("RAY_ADDRESS", None)
    write, reset = ray_utils.write_ray_address, ray_common_utils.reset_ray_address
    set_sigterm = ray_utils.set_sigterm_handler
    ray_utils.write_ray_address = ray_common_utils.reset_ray_address = lambda *args, **kwargs: None
    # keep this process's SIGTERM handler while its Ray starts: Ray's in-process head would drain for 30 s and
    # exit 1, ray.init's would sys.exit(15); ours stops everything like Ctrl-C (planner.cli.signals)
    ray_utils.set_sigterm_handler = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ray_utils.write_ray_address, ray_common_utils.reset_ray_address = write, reset
        ray_utils.set_sigterm_handler = set_sigterm
        if saved_address is not None:
            os.environ["RAY_ADDRESS"] = saved_address


def raylet_cap_from_env() -> int:
    text = os.environ.get("BATCHPLAN_RAYLET_CAP", str(DEFAULT_RAYLET_CAP))
    try:
        cap = int(text)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ConfigError(f"BATCHPLAN_RAYLET_CAP={text!r} is invalid (use a positive integer, e.g. 8)")
    return cap


@dataclass(frozen=True, kw_only=True)
class RayNode:
    """A live Ray node the planner can pin a probe to."""

    node_id: str
    address: str
    num_gpus: float = 0.0


@dataclass(kw_only=True)
class RaySession:
    """A connected Ray driver and the nodes it may place probes on."""

    address: str
    """what the driver connected to (``local`` for a cluster this session started)"""
    started_here: bool
    """whether this session started the Ray processes (and will stop them)"""
    nodes: list[RayNode] = field(default_factory=list)

    worker_env: dict[str, str] = field(default_factory=dict)
    """environment variables every Ray worker of this session already has (set before a cluster started
    here spawned its raylets): actors need no ``runtime_env`` for them, so they reuse the idle workers Ray
    starts with each raylet instead of starting new ones"""

    def gpu_nodes(self) -> list[RayNode]:
        """Nodes that report GPUs (a real cluster's CPU-only head is not probed)."""
        return [n for n in self.nodes if n.num_gpus > 0]


def _alive_nodes() -> list[RayNode]:
    import ray

    nodes = []
    for entry in ray.nodes():
        if not entry.get("Alive"):
            continue
        nodes.append(
            RayNode(
                node_id=entry["NodeID"],
                address=entry.get("NodeManagerAddress", ""),
                num_gpus=float(entry.get("Resources", {}).get("GPU", 0.0)),
            )
        )
    return nodes


def _init_kwargs() -> dict:
    return {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": False}


#: a cluster started here runs for one plan: no autoscaler monitor (its size is fixed), no log monitor
#: (workers' logs are not streamed to the driver: log_to_driver is off), no usage-stats reporting. Each is a
#: Python process importing Ray, seconds of CPU on a small machine.
_TRIMMED_HEAD_ARGS = {"no_monitor": True, "include_log_monitor": False}


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` set in this process (inherited by the Ray processes it starts), restored afterwards."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def ray_session(
    *,
    address: str | None = None,
    num_simulated_nodes: int = 0,
    raylet_cap: int | None = None,
    worker_env: dict[str, str] | None = None,
) -> Iterator[RaySession]:
    """Yield a connected :class:`RaySession`.

    Args:
        address: join this cluster (``auto``, ``ray://host:10001``, ``host:6379``).
        num_simulated_nodes: start a local cluster with ``min(num_simulated_nodes, raylet_cap)`` raylets
            (ignored with ``address``). If this process is already connected to Ray (a test fixture, a
            notebook), that connection is used as it is. With neither (0 and no address), a Ray cluster
            already running here that this user may trust (``find_running_cluster``) is joined, else an
            embedded one started.
        raylet_cap: most raylets to start (default ``BATCHPLAN_RAYLET_CAP`` or ``DEFAULT_RAYLET_CAP``).
        worker_env: environment the probes need; a cluster started here gets it in its workers'
            environment from the start (``RaySession.worker_env``), a joined one does not.

    Raises:
        ClusterUnreachableError: ``address`` cannot be reached.
    """
    if _already_connected():  # a test fixture, a notebook: used as it is
        yield RaySession(address="existing", started_here=False, nodes=_alive_nodes())
        return
    gcs_address = None
    if address is not None or num_simulated_nodes == 0:
        address, gcs_address = _join_address(address)
    if address is None or (gcs_address is not None and is_this_machine(split_host_port(gcs_address)[0])):
        _keep_ray_on_loopback()  # a cluster on 127.0.0.1 is joined from this host, as 127.0.0.1
    import ray

    if address is not None:
        # one bounded question first (planner.probing.gcs_probe): ray.init given a port that is not a GCS retries
        # for minutes; a GCS that wants a token is then asked again with the one found here (ray_auth)
        if gcs_address is not None and ask_gcs(gcs_address) is GcsAnswer.WANTS_TOKEN:
            from planner.probing.ray_auth import prepare_join_auth

            prepare_join_auth(gcs_address)
        try:
            with _keeping_sigterm_handler():
                ray.init(address=address, **_init_kwargs())
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError or ValueError by version
            raise ClusterUnreachableError(
                f"cannot reach the Ray cluster at {address!r}: {exc} "
                "(check the address, that `ray status` works there, and the firewall)"
            ) from exc
        try:
            yield RaySession(address=address, started_here=False, nodes=_alive_nodes())
        finally:
            ray.shutdown()
        return

    check_ray_temp_dir()
    cap = raylet_cap or raylet_cap_from_env()
    started_env = started_ray_environment(worker_env)
    with _local_ray(max(1, min(num_simulated_nodes, cap)) if num_simulated_nodes > 0 else 0, started_env):
        yield RaySession(
            address="local", started_here=True, nodes=_alive_nodes(), worker_env=dict(worker_env or {})
        )


#: Ray runs its workers at niceness 15 (its ``worker_niceness``), below every ordinary process: on a machine
#: with other work (a laptop, a shared login node) the probes doing the work a plan waits for got a few per
#: cent of a core (measured: the README's first plan, about a minute on an idle machine, did not finish in 10
#: minutes at load 10 on 2 cores). A Ray this process starts runs them at the planner's own priority; a joined
#: cluster keeps its own.
WORKER_NICENESS = "0"
WORKER_NICENESS_VARIABLE = "RAY_worker_niceness"
"""Ray's name for it (its config names are case-sensitive)"""


def started_ray_environment(worker_env: dict[str, str] | None) -> dict[str, str]:
    """The variables a Ray this process starts (and its workers) is given: ``worker_env``, usage statistics
    off, and workers at the planner's niceness (``WORKER_NICENESS``)."""
    return {**(worker_env or {}), "RAY_USAGE_STATS_ENABLED": "0", WORKER_NICENESS_VARIABLE: WORKER_NICENESS}


@contextlib.contextmanager
def _local_ray(num_raylets: int, started_env: dict[str, str]) -> Iterator[None]:
    """A Ray this process starts and stops: ``num_raylets`` simulated raylets on 127.0.0.1, or with 0 an
    embedded one; watched (``planner.probing.watchdog``) so that it stops even if this process is killed."""
    import ray

    from planner.probing.watchdog import ray_watchdog

    cluster = None
    sigterm = _sigterm_handler()
    with ray_watchdog():  # stops what is started below if this process dies without stopping it
        try:
            if num_raylets > 0:
                with _own_cluster_only(), _environment(started_env):
                    cluster = _start_simulated_cluster(num_raylets)
                    with _signals_held(sigterm):  # the driver's core worker installs C++ handlers here
                        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, **_init_kwargs())
            else:
                log.info("starting an embedded local Ray on %s, dashboard off", LOOPBACK)
                with _own_cluster_only(), _environment(started_env):
                    ray.init(
                        address="local",  # a new instance: never one found in RAY_ADDRESS or the address file
                        _node_ip_address=LOOPBACK,
                        include_dashboard=False,
                        object_store_memory=SIMULATED_OBJECT_STORE_BYTES,
                        **_init_kwargs(),
                    )
            _restore_sigterm_handler(sigterm)  # Ray's in-process cluster nodes and ray.init replaced it
            yield
        finally:
            with contextlib.suppress(Exception):
                ray.shutdown()
            if cluster is not None:
                with contextlib.suppress(Exception), _own_cluster_only():
                    cluster.shutdown()
            _restore_sigterm_handler(sigterm)


@contextlib.contextmanager
def _signals_held(handler) -> Iterator[None]:
    """SIGINT and SIGTERM held pending while a driver connects to a cluster started here (which starts no
    process: nothing inherits the mask), then delivered to ``handler``, put back first. Ray's core worker
    installs a C++ SIGTERM handler that dumps a stack and aborts; a signal in that window ended batchplan with
    SIGABRT instead of a clean teardown. Main thread only (elsewhere nothing is held)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        _restore_sigterm_handler(handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a pending signal is delivered now, to ours


def _start_simulated_cluster(num_raylets: int):
    """``ray.cluster_utils.Cluster`` with ``num_raylets`` raylets, all on 127.0.0.1, dashboard off."""
    from ray.cluster_utils import Cluster

    common = {
        "node_ip_address": LOOPBACK,
        "num_cpus": 1,
        "num_gpus": 0,
        "object_store_memory": SIMULATED_OBJECT_STORE_BYTES,
    }
    log.info("starting a local Ray cluster: %d raylet(s) on %s, dashboard off", num_raylets, LOOPBACK)
    # stopped by _local_ray (exceptions, Ctrl-C, SIGTERM, the watchdog); Ray's own exit hook would delete the
    # user's address file outside _own_cluster_only()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**common, **_TRIMMED_HEAD_ARGS, "include_dashboard": False},
        shutdown_at_exit=False,
    )
    try:
        for _ in range(num_raylets - 1):
            cluster.add_node(wait=False, **common)
        cluster.wait_for_nodes()
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.shutdown()
        raise
    return cluster


def _sigterm_handler():
    """This process's SIGTERM handler, to put back after starting Ray (None off the main thread)."""
    import signal
    import threading

    return signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None


def _restore_sigterm_handler(handler) -> None:
    """Put back a SIGTERM handler this process had before starting Ray. ``ray.init`` replaces it (with
    ``sys.exit(15)``, and its core worker with a C++ handler that dumps a stack and aborts), and so does each
    in-process ``ray.cluster_utils`` node (drain 30 s, then ``sys.exit(1)``). The CLI's handler turns SIGTERM
    into a clean teardown like Ctrl-C (``planner.cli.signals``)."""
    import signal

    if callable(handler):
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _keeping_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handler across ``ray.init`` (see ``_restore_sigterm_handler``)."""
    handler = _sigterm_handler()
    try:
        yield
    finally:
        _restore_sigterm_handler(handler)


def deal_round_robin(names: Sequence[str], nodes: Sequence[RayNode]) -> dict[str, RayNode]:
    """Assign simulated node names to Ray nodes: one each while there are enough, then shared in turn."""
    if not nodes:
        raise ClusterUnreachableError("the Ray cluster has no live node to place probes on")
    return {name: nodes[i % len(nodes)] for i, name in enumerate(names)}
