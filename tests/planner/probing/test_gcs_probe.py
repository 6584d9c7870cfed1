"""The one bounded question asked of every Ray address before ``ray.init`` (``planner/probing/gcs_probe.py``,
``grpc_wire.py``; issue #34, item 4): a port that is not a GCS is one line naming the address, what answered
and the likely right port, within the probe's deadline, where ``ray.init`` retried for 150-660 s.

The servers are small stand-ins on 127.0.0.1 that answer as a GCS, a token-protected GCS, another gRPC server,
an HTTP/1 server, another protocol or not at all (``tests/planner/cli/test_cli_ray_auth.py`` and the running-Ray
tests ask real GCSs)."""

from __future__ import annotations

import os
import struct
import time

import pytest

from planner.errors import ClusterUnreachableError
from planner.probing import gcs_probe
from planner.probing.gcs_probe import GcsAnswer, ask_gcs, listening_uid
from planner.probing.grpc_wire import GrpcReply
from planner.trust import owner_name
from tests.planner.cli_helpers import assert_user_error, run_cli


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal_indexed(
    name: str, value: str
) -> bytes:  # literal with incremental indexing, as gRPC C-core sends
    return b"\x40" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def grpc_answer(status: int, *, data: bool) -> bytes:
    """What a gRPC C-core server sends for one call: SETTINGS, response headers, a message, trailers."""
    settings = _frame(0x4, 0, 0, b"\x00\x04\x00\x40\x00\x00")
    if not data:  # trailers only, as for UNIMPLEMENTED or UNAUTHENTICATED
        block = (
            b"\x88"
            + _literal_indexed("content-type", "application/grpc")
            + _literal_indexed("grpc-status", str(status))
        )
        return settings + _frame(0x1, 0x5, 1, block)
    headers = _frame(0x1, 0x4, 1, b"\x88" + _literal_indexed("content-type", "application/grpc"))
    message = _frame(0x0, 0, 1, b"\x00\x00\x00\x00\x04\x0a\x02\x01\x02")
    trailers = _frame(0x1, 0x5, 1, b"\xbe" + _literal_indexed("grpc-status", str(status)))  # 0xbe: dynamic 62
    return settings + headers + message + trailers


def test_a_gcs_is_recognised_with_or_without_token_authentication(server) -> None:
    assert ask_gcs(f"127.0.0.1:{server(grpc_answer(0, data=True))}") is GcsAnswer.ACCEPTS
    assert ask_gcs(f"127.0.0.1:{server(grpc_answer(16, data=False))}") is GcsAnswer.WANTS_TOKEN


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (grpc_answer(12, data=False), "it is a gRPC server without Ray's GCS service"),
        (grpc_answer(14, data=False), "it answered gRPC status 14 where a GCS answers 0"),
        (
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            "it answers HTTP/1 ('HTTP/1.1 400 Bad Request'), not gRPC",
        ),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "it answers in a protocol that is not HTTP/2"),
        (b"\x1b]0;forged\x07HTTP/1.1 200\r\n", "it answers in a protocol that is not HTTP/2"),
    ],
)
def test_a_port_that_is_not_a_gcs_is_one_line_naming_what_answered(server, answer: bytes, said: str) -> None:
    port = server(answer)
    with pytest.raises(ClusterUnreachableError) as raised:
        ask_gcs(f"127.0.0.1:{port}")
    message = str(raised.value)
    assert message.startswith(f"'127.0.0.1:{port}' is not a Ray cluster's GCS: {said}"), message
    assert "\n" not in message and "\x1b" not in message and "`ray status` on the head prints it" in message


def test_a_silent_port_is_said_at_the_deadline(server) -> None:
    port = server(None)
    started = time.monotonic()
    with pytest.raises(
        ClusterUnreachableError,
        match=f"'127.0.0.1:{port}' is not a Ray cluster's GCS: it accepts "
        "connections but answered nothing in 1 s",
    ):
        ask_gcs(f"127.0.0.1:{port}", timeout_s=1.0)
    assert time.monotonic() - started < 30  # 1 s asked; 30 s tells a bounded wait from a hang at any load


def test_the_likely_right_port_is_a_gcs_running_here_else_ray_s_default(server, monkeypatch) -> None:
    port = server(b"HTTP/1.1 404 Not Found\r\n\r\n")
    monkeypatch.setattr(gcs_probe, "running_gcs_ports", lambda: [])
    with pytest.raises(
        ClusterUnreachableError, match="Ray's GCS listens on 6379 unless `ray start --head --port`"
    ):
        ask_gcs(f"127.0.0.1:{port}")
    gcs = server(grpc_answer(0, data=True))
    monkeypatch.setattr(gcs_probe, "running_gcs_ports", lambda: [gcs])
    with pytest.raises(ClusterUnreachableError) as raised:
        ask_gcs(f"127.0.0.1:{port}")
    assert f"a Ray GCS listens on this machine at 127.0.0.1:{gcs}, run by {owner_name(os.geteuid())}" in str(
        raised.value
    )


def test_the_dashboard_s_port_is_named_as_such(monkeypatch) -> None:
    answered = GrpcReply(
        first_bytes=b"HTTP/1.1 404 Not Found\r\n", http2=False
    )  # what aiohttp says to HTTP/2
    monkeypatch.setattr(gcs_probe, "unary_call", lambda *args, **kwargs: answered)
    with pytest.raises(ClusterUnreachableError, match=r"\(8265 is the Ray dashboard's port\)"):
        ask_gcs("127.0.0.1:8265")


def test_no_connection_is_said_with_the_address(monkeypatch) -> None:
    monkeypatch.setattr(gcs_probe, "running_gcs_ports", lambda: [])
    with pytest.raises(
        ClusterUnreachableError, match="cannot reach the Ray cluster at '127.0.0.1:1': Connection refused"
    ):
        ask_gcs("127.0.0.1:1")


def test_the_owner_of_a_listening_port_is_read_from_proc(server) -> None:
    port = server(None)
    assert listening_uid("127.0.0.1", port) == os.geteuid()
    assert listening_uid("localhost", port) == os.geteuid()
    assert listening_uid("127.0.0.1", 1) is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_plan_given_a_port_that_is_not_a_gcs_ends_in_one_line_not_minutes(server, tmp_path, how: str) -> None:
    port = server(None)  # accepts and says nothing: ray.init waited 150-660 s here
    address = f"127.0.0.1:{port}"
    args = ("--address", address) if how == "--address" else ()
    env = {"RAY_ADDRESS": address} if how == "RAY_ADDRESS" else {}
    # the subprocess timeout is what tells a bounded answer from a hang: 120 s leaves room for a loaded machine
    result = run_cli(
        "plan", *args, "--model", "resnet18", "--no-cache", "--no-write", cwd=tmp_path, env=env, timeout=120
    )
    assert_user_error(result, 2, f"'{address}' is not a Ray cluster's GCS", "answered nothing in 8 s")
