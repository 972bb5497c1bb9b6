"""The process node's TCP relay carries a pod's address and port to a server listening
elsewhere, byte for byte in both directions; a target that is not listening closes the
client's connection, as a server that has not started yet would."""

from __future__ import annotations

import socket
import threading

from flexinfer_devcluster.relay import Relay, free_port


def echo_server() -> tuple[socket.socket, int]:
    """Answers every connection with what it read until the client's half-close, reversed."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                conn.sendall(data[::-1])

    threading.Thread(target=serve, daemon=True).start()
    return listener, int(listener.getsockname()[1])


def test_bytes_go_both_ways_through_the_relay_and_close_ends_it() -> None:
    listener, port = echo_server()
    relay = Relay("127.0.0.1", free_port(), port)
    try:
        payload = bytes(range(256)) * 1000  # more than one chunk
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := client.recv(65536):
                received += chunk
        assert received == payload[::-1]
    finally:
        relay.close()
        listener.close()
    try:
        socket.create_connection(("127.0.0.1", relay.port), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    assert refused, "the relay still listens after close()"


def test_a_target_that_is_not_listening_closes_the_client() -> None:
    relay = Relay("127.0.0.1", free_port(), free_port())
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            client.settimeout(10)
            assert client.recv(1) == b""  # closed, not hung
    finally:
        relay.close()
