"""The socket under one streamed reply, so a cancel from any thread can cut it at once.

Closing an httpx response from another thread does not wake a thread blocked reading it; shutting
the socket down does.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx

from ..base import Stream


class Connection:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._cut = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's trace hook: the socket is known as soon as it connects, before any header arrives."""
        if event == "connection.connect_tcp.complete":
            self._hold(info.get("return_value"))

    def attach(self, response: httpx.Response) -> None:
        self._hold(response.extensions.get("network_stream"))

    def _hold(self, network_stream: Any) -> None:
        sock = network_stream.get_extra_info("socket") if network_stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._socket = sock
            if self._cut:
                _shutdown(sock)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            if self._socket is not None:
                _shutdown(self._socket)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing left to cut


class CuttableStream(Stream):
    """A reply's events (or a lab's, over a connection per column); cancelling it also cuts its connections."""

    def __init__(self, *connections: Connection) -> None:
        super().__init__()
        self._connections = connections

    def cancel(self) -> None:
        super().cancel()
        for connection in self._connections:
            connection.cut()
