"""A TCP relay from a pod's address to a server that listens elsewhere on this machine.

The process node gives each pod its own loopback address. A server that treats a
loopback listener differently from the all-addresses one it gets in a real pod (Ollama
refuses requests whose Host header is a name when it listens on loopback, its
DNS-rebinding guard) listens on all addresses on a port of its own instead, and this
relay carries the pod's address and port to it byte for byte: what reaches the server is
what a client sent to the pod, Host header included.

Threads and sockets only; no cluster I/O. `close()` ends the listener and every
connection it carries.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading

CONNECT_TIMEOUT_SECONDS = 5.0
CHUNK = 65536


def free_port() -> int:
    """A port nothing listens on, on every address of this machine (just handed out by
    the kernel; a server started at once gets it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("0.0.0.0", 0))  # where the server behind the relay binds
        return int(probe.getsockname()[1])


class Relay:
    """Listen on (`address`, `port`); pipe each connection to 127.0.0.1:`target_port`.

    A connection the target refuses is closed at once, as a client of the pod would see
    a server that is not listening yet.
    """

    def __init__(self, address: str, port: int, target_port: int) -> None:
        self.address = address
        self.port = port
        self.target_port = target_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((address, port))
        self._listener.listen(64)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._accept, name=f"relay-{address}:{port}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._open)
            self._open.clear()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._thread.join(timeout=5)

    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.update(sockets)
            return True

    def _forget(self, *sockets: socket.socket) -> None:
        with self._lock:
            for sock in sockets:
                self._open.discard(sock)
        for sock in sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(
                    ("127.0.0.1", self.target_port), timeout=CONNECT_TIMEOUT_SECONDS
                )
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            if not self._track(client, upstream):
                client.close()
                upstream.close()
                return
            done = threading.Barrier(2, action=functools.partial(self._forget, client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=_pump, args=(source, sink, done), name="relay-pump", daemon=True
                ).start()


def _pump(source: socket.socket, sink: socket.socket, done: threading.Barrier) -> None:
    """Copy one direction until its end; then tell the other side no more will come."""
    try:
        while chunk := source.recv(CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
    with contextlib.suppress(threading.BrokenBarrierError):
        done.wait()
