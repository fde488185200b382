"""A TCP relay to the apiserver that can freeze: every connection stays open and silent, as behind a network
partition that drops packets without a reset (the hung connection that no error ever ends). `partition()` does it to
the connections open now only, for good, as a NAT or load balancer that forgets a flow does: new ones work."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class FreezableProxy:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._open: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            severed = threading.Event()
            with self._lock:
                self._open.add(severed)
            threading.Thread(target=self._relay, args=(client, upstream, severed), daemon=True).start()

    def partition(self) -> int:
        """Silences every connection open now, for good; returns how many."""
        with self._lock:
            for severed in self._open:
                severed.set()
            count, self._open = len(self._open), set()
        return count

    def _relay(self, a: socket.socket, b: socket.socket, severed: threading.Event) -> None:
        peers = {a: b, b: a}
        with a, b:
            while not self._closed.is_set():
                if self.frozen.is_set() or severed.is_set():  # bytes wait in the kernel's buffers; nobody hears
                    self._closed.wait(0.1)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        with self._lock:
                            self._open.discard(severed)
                        return
                    peers[sock].sendall(data)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
