"""An API-server outage for chosen clients: a TCP forwarder the test can cut.

Clients given `kubeconfig()` reach the API server through a loopback port; `cut()`
closes that port (new connections are refused, as during an API-server restart) and
resets every open connection; `restore()` listens on the same port again. TLS passes
through untouched (the serving certificate names 127.0.0.1, not a port). Everyone
else, the test included, keeps talking to the API server directly.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from pathlib import Path
from urllib.parse import urlparse

import yaml


class Forwarder:
    def __init__(self, upstream: str) -> None:
        target = urlparse(upstream)
        self._upstream = (target.hostname or "127.0.0.1", int(target.port or 443))
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self.restore()

    def kubeconfig(self, original: Path, path: Path) -> Path:
        """A copy of `original` whose server is this forwarder."""
        document = yaml.safe_load(original.read_text())
        for cluster in document["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(yaml.safe_dump(document))
        return path

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = self._connections, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in connections:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: the peer sees a reset, as from a crashed server.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._connections |= {client, server}
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._connections -= {a, b}
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()
