"""Fixtures of the probing tests."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest


@pytest.fixture
def server() -> Iterator:
    """``start(answer)``: a listener on 127.0.0.1 that sends ``answer`` (None: nothing, ever) to each connection
    after reading what the client sent; returns its port."""
    sockets: list[socket.socket] = []

    def start(answer: bytes | None) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        sockets.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                sockets.append(conn)
                if answer is not None:
                    try:
                        conn.recv(4096)
                        conn.sendall(answer)
                    except OSError:
                        pass

        threading.Thread(target=serve, daemon=True).start()
        return listener.getsockname()[1]

    yield start
    for sock in sockets:
        sock.close()
