"""One bounded question to an address before ``ray.init`` is given it: is a Ray GCS listening there?

``ray.init`` given a port that accepts TCP but is not a GCS (the dashboard's 8265, Ray Client's 10001, any
other server) retries for minutes (150-660 s were seen) and prints nothing useful. Here the port is asked one
gRPC question (``NodeInfoGcsService/GetClusterId``, what Ray's own GCS client asks first; ``grpc_wire``) within
:data:`GCS_PROBE_TIMEOUT_S`, and anything but a GCS's answer is one line naming the address, what answered and
the port that is likely right: the GCS ports of the Ray clusters running on this machine where the address is
this machine's, else Ray's default 6379.

A GCS answers the call (``grpc-status`` 0) or, under token authentication without our token, refuses it with
``UNAUTHENTICATED`` (16): then ``planner.probing.ray_auth`` takes over. A gRPC server without Ray's GCS service
answers ``UNIMPLEMENTED``; an HTTP/1 server answers ``HTTP/1.1 400``; a silent one nothing.

Where the GCS runs on this machine, :func:`listening_owner` names the user whose process listens on its port
(from ``/proc/net/tcp``): whose cluster it is.
"""

from __future__ import annotations

import enum
import ipaddress
import re
import sys
from pathlib import Path

from planner.errors import ClusterUnreachableError
from planner.probing.grpc_wire import unary_call
from torchkit.terminal_text import printable

#: seconds for the whole question, the TCP connection included: a GCS answers in milliseconds; under the 10 s
#: within which a wrong port must be said (issue #34), with room for a loaded machine
GCS_PROBE_TIMEOUT_S = 8.0
#: ``ray start --head``'s GCS port unless ``--port`` says otherwise
DEFAULT_GCS_PORT = 6379
_GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
_UNAUTHENTICATED, _UNIMPLEMENTED = 16, 12
#: Ray's other default ports, named when a user gives one of them (Ray 2.60 ``ray_constants``)
_OTHER_RAY_PORTS = {
    8265: "the Ray dashboard's port",
    10001: "Ray Client's port (ray://HOST:10001)",
    52365: "the dashboard agent's port",
    8076: "the object manager's port",
    8077: "the node manager's port",
}


class GcsAnswer(enum.Enum):
    """What a GCS said to this driver."""

    ACCEPTS = "accepts"
    """it answered: no authentication, or the token this process sends"""
    WANTS_TOKEN = "wants a token"
    """token authentication refused the call (``planner.probing.ray_auth`` says what to do)"""


def split_host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) -> (host, port), or None where it is not one."""
    host, _, port_text = address.rpartition(":")
    if (
        not host
        or not port_text.isascii()
        or not port_text.isdigit()
        or len(port_text) > 5
        or int(port_text) > 65535
    ):
        return None
    return host.strip("[]"), int(port_text)


def ask_gcs(address: str, *, timeout_s: float = GCS_PROBE_TIMEOUT_S) -> GcsAnswer:
    """Ask ``address`` (``host:port``) whether it is a Ray GCS, within ``timeout_s``.

    Raises:
        ClusterUnreachableError: no connection, or something that is not a GCS answered (or nothing did):
            one line naming the address, what answered and the likely right port.
    """
    parts = split_host_port(address)
    if parts is None:
        raise ClusterUnreachableError(
            f"{printable(address)!r} is not a Ray address (use HOST:PORT, e.g. "
            f"head-node:{DEFAULT_GCS_PORT}, or auto)"
        )
    host, port = parts
    try:
        reply = unary_call(host, port, _GCS_METHOD, timeout_s=timeout_s)
    except OSError as exc:
        raise ClusterUnreachableError(
            f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc} "
            f"(check the address and port{_likely_ports(host, port)}, that `ray status` works there, and the "
            "firewall)"
        ) from None
    status = reply.grpc_status
    if reply.http2 and status == 0 and reply.data_bytes > 0:
        return GcsAnswer.ACCEPTS
    if reply.http2 and status == _UNAUTHENTICATED:
        return GcsAnswer.WANTS_TOKEN
    if not reply.first_bytes:
        what = (
            f"accepts connections but answered nothing in {timeout_s:.0f} s"
            if not reply.closed
            else "accepts connections and closes them without a word"
        )
    elif not reply.http2:
        said = reply.first_bytes.split(b"\r\n", 1)[0].decode("latin-1")
        what = (
            f"answers HTTP/1 ({printable(said, max_chars=40)!r}), not gRPC"
            if said.startswith("HTTP/")
            else "answers in a protocol that is not HTTP/2 (a GCS speaks gRPC)"
        )
    elif status == _UNIMPLEMENTED:
        what = "is a gRPC server without Ray's GCS service"
    elif status is not None:
        what = f"answered gRPC status {status} where a GCS answers 0"
    else:
        what = "speaks HTTP/2 but gave no gRPC answer a GCS gives"
    named = _OTHER_RAY_PORTS.get(port)
    raise ClusterUnreachableError(
        f"{address!r} is not a Ray cluster's GCS: it {what}{f' ({port} is {named})' if named else ''} (give the "
        f"GCS address{_likely_ports(host, port)}: `ray status` on the head prints it)"
    )


def _likely_ports(host: str, port: int) -> str:
    """``; likely ...``: the GCS ports of Ray clusters running here where ``host`` is this machine, else Ray's
    default port."""
    running = sorted(p for p in running_gcs_ports() if p != port) if is_this_machine(host) else []
    if running:
        owners = "; ".join(
            f"{host}:{p}" + (f", run by {owner}" if (owner := listening_owner(host, p)) else "")
            for p in running[:4]
        )
        return f"; a Ray GCS listens on this machine at {owners}"
    if port != DEFAULT_GCS_PORT:
        return f"; Ray's GCS listens on {DEFAULT_GCS_PORT} unless `ray start --head --port` chose another"
    return ""


def is_this_machine(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (the processes listening there are this machine's)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_GCS_PORT_FLAG = re.compile(rb"--gcs_server_port=([0-9]{1,5})\b")


def running_gcs_ports() -> list[int]:
    """Ports of the ``gcs_server`` processes running on this machine (their command lines, from ``/proc``)."""
    ports = []
    proc = Path("/proc")
    if not proc.is_dir():
        return ports
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_bytes().strip() != b"gcs_server":
                continue
            found = _GCS_PORT_FLAG.search((entry / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            continue
        if found:
            ports.append(int(found.group(1)))
    return sorted(set(ports))


def listening_uid(host: str, port: int) -> int | None:
    """The uid owning the socket that listens on ``port`` for ``host`` on this machine (``/proc/net/tcp`` and
    ``tcp6``), or None where none is seen (another machine's host, no ``/proc``)."""
    try:
        wanted = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != "0A":  # 0A: LISTEN
                continue
            local_hex, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) != port:
                continue
            bound = _proc_address(local_hex)
            if bound is not None and (bound == wanted or bound.is_unspecified and wanted.is_loopback):
                return int(fields[7])
    return None


def listening_owner(host: str, port: int) -> str | None:
    """``uid 0 (root)`` of the process listening on ``host:port`` here (:func:`listening_uid`), or None."""
    from planner.trust import owner_name

    uid = listening_uid(host, port)
    return owner_name(uid) if uid is not None else None


def _proc_address(hex_text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as ``/proc/net/tcp{,6}`` prints it (32-bit words in host order), a v4-mapped v6 as v4."""
    try:
        raw = bytes.fromhex(hex_text)
    except ValueError:
        return None
    words = (
        b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    )
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
