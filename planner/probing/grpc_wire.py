"""One unary gRPC call over plain HTTP/2 on a socket, with a deadline, to ask a port what it is before Ray is
given it (``planner.probing.gcs_probe``): the standard library only (Ray's Python install has no ``grpcio``).

What it sends: the HTTP/2 client preface, an empty SETTINGS frame, one HEADERS frame (HPACK literals without
indexing, no Huffman coding: RFC 7541 §6.2.2) for ``POST <method>``, and one DATA frame holding an empty
protobuf message (a gRPC length prefix of 0: every field at its default). What it reads: frames until the
stream ends, the connection closes or the deadline passes; header blocks are decoded as far as this needs
(indexed and literal fields, the static and dynamic tables; a Huffman-coded string is read as None).

Known limitations: no TLS (Ray's GCS speaks plain HTTP/2 unless ``RAY_USE_TLS`` is set: then the answer is
"not HTTP/2"); CONTINUATION frames are read, padding and priority flags honoured, flow control ignored (one
small request and reply fit the initial windows).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _GOAWAY, _CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x7, 0x9
_END_STREAM, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x4, 0x8, 0x20
_STREAM = 1
#: most bytes read from the port: a GCS's reply to an empty request is well under 1 KiB
_MAX_READ_BYTES = 2**16

#: RFC 7541 Appendix A: the names of the static table (1-based); values are read only for ``:status``
_STATIC_NAMES = (
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
)
_STATIC_STATUS = {8: "200", 9: "204", 10: "206", 11: "304", 12: "400", 13: "404", 14: "500"}


@dataclass(kw_only=True)
class GrpcReply:
    """What a port answered to one gRPC call."""

    first_bytes: bytes = b""
    """the first bytes it sent (to name a protocol that is not HTTP/2: ``HTTP/1.1 400 ...``)"""
    http2: bool = False
    """it answered with an HTTP/2 SETTINGS frame, as every HTTP/2 server must first"""
    headers: dict[str, str | None] = field(default_factory=dict)
    """response headers and trailers of the call, lower-case names (a Huffman-coded value is None)"""
    data_bytes: int = 0
    """bytes of DATA the call returned (a reply message)"""
    reset: bool = False
    """the server reset the stream or sent GOAWAY"""
    ended: bool = False
    """the call ended (END_STREAM), rather than the connection closing or the deadline passing"""
    closed: bool = False
    """the server closed the connection"""

    @property
    def grpc_status(self) -> int | None:
        """the call's ``grpc-status``, or None where none was read"""
        value = self.headers.get("grpc-status")
        return int(value) if value is not None and value.isdigit() else None


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541 §5.1) at ``pos``: (value, next position)."""
    mask = (1 << prefix_bits) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80 or shift > 28:
            return value, pos


def _string(data: bytes, pos: int) -> tuple[str | None, int, int]:
    """An HPACK string (§5.2): (text, or None where Huffman-coded; its length; next position)."""
    huffman = bool(data[pos] & 0x80)
    length, pos = _integer(data, pos, 7)
    raw = data[pos : pos + length]
    return (None if huffman else raw.decode("latin-1")), length, pos + length


class _HeaderReader:
    """HPACK decoding with a dynamic table (§2.3.2); enough to read ``:status`` and ``grpc-status``."""

    def __init__(self) -> None:
        self.dynamic: list[tuple[str | None, str | None]] = []

    def _entry(self, index: int) -> tuple[str | None, str | None]:
        if 1 <= index <= len(_STATIC_NAMES):
            return _STATIC_NAMES[index - 1], _STATIC_STATUS.get(index)
        offset = index - len(_STATIC_NAMES) - 1
        return self.dynamic[offset] if 0 <= offset < len(self.dynamic) else (None, None)

    def read(self, block: bytes) -> list[tuple[str | None, str | None]]:
        fields, pos = [], 0
        while pos < len(block):
            byte = block[pos]
            if byte & 0x80:  # indexed field
                index, pos = _integer(block, pos, 7)
                fields.append(self._entry(index))
                continue
            if byte & 0xE0 == 0x20:  # dynamic table size update
                _, pos = _integer(block, pos, 5)
                continue
            indexing = bool(byte & 0x40)
            index, pos = _integer(block, pos, 6 if indexing else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, _, pos = _string(block, pos)
            value, _, pos = _string(block, pos)
            fields.append((name, value))
            if indexing:
                self.dynamic.insert(0, (name, value))
        return fields


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding (short ASCII only)."""
    encoded_name, encoded_value = name.encode(), value.encode()
    assert len(encoded_name) < 127 and len(encoded_value) < 127  # one-byte lengths: our own fixed fields
    return b"\x00" + bytes([len(encoded_name)]) + encoded_name + bytes([len(encoded_value)]) + encoded_value


def unary_call(
    host: str, port: int, method: str, *, timeout_s: float, extra_headers: tuple[tuple[str, str], ...] = ()
) -> GrpcReply:
    """Call ``method`` (``/package.Service/Method``) at ``host:port`` with an empty request; what came back by
    ``timeout_s`` (connecting included).

    Raises:
        OSError: no TCP connection could be made (refused, unreachable, timed out).
    """
    deadline = time.monotonic() + timeout_s
    reply = GrpcReply()
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", f"{host}:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *extra_headers,
        ]
        block = b"".join(_literal(name, value) for name, value in fields)
        sock.sendall(
            _PREFACE
            + _frame(_SETTINGS, 0, 0, b"")
            + _frame(_HEADERS, _END_HEADERS, _STREAM, block)
            + _frame(_DATA, _END_STREAM, _STREAM, b"\x00\x00\x00\x00\x00")
        )
        _read_reply(sock, reply, deadline)
    return reply


def _read_reply(sock: socket.socket, reply: GrpcReply, deadline: float) -> None:
    buffer, received = b"", 0
    reader = _HeaderReader()
    pending_block = b""
    while not reply.ended and not reply.reset and received < _MAX_READ_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sock.settimeout(left)
        try:
            chunk = sock.recv(_MAX_READ_BYTES - received)
        except TimeoutError:
            return
        except OSError:
            reply.closed = True
            return
        if not chunk:
            reply.closed = True
            return
        if not reply.first_bytes:
            reply.first_bytes = chunk[:64]
            reply.http2 = len(chunk) >= 4 and chunk[3] == _SETTINGS  # the server preface is a SETTINGS frame
        if not reply.http2:
            return
        received += len(chunk)
        buffer += chunk
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags, stream = buffer[3], buffer[4], int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
            if kind == _GOAWAY or (kind == _RST_STREAM and stream == _STREAM):
                reply.reset = True
            if stream != _STREAM:
                continue
            if kind == _DATA:
                reply.data_bytes += len(_unpadded(payload, flags))
            elif kind in (_HEADERS, _CONTINUATION):
                pending_block += _header_fragment(payload, flags) if kind == _HEADERS else payload
                if flags & _END_HEADERS:
                    for name, value in reader.read(pending_block):
                        if name is not None:
                            reply.headers[name] = value
                    pending_block = b""
            if kind in (_DATA, _HEADERS) and flags & _END_STREAM:
                reply.ended = True


def _unpadded(payload: bytes, flags: int) -> bytes:
    if flags & _PADDED and payload:
        return payload[1 : len(payload) - payload[0]]
    return payload


def _header_fragment(payload: bytes, flags: int) -> bytes:
    payload = _unpadded(payload, flags)
    return payload[5:] if flags & _PRIORITY else payload
