"""A TCP relay to the apiserver that can freeze: every connection stays open and silent, as behind a network
partition that drops packets without a reset (the hung connection that no error ever ends). `partition()` does it to
the connections open now only, for good, as a NAT or load balancer that forgets a flow does: new ones work.

While frozen, what a client sent waits here and is relayed once the freeze ends, as a sender's kernel retransmits
unacknowledged data when a partition heals, even after the socket was closed normally (FIN). A client that resets
its connection meanwhile (SO_LINGER 0, or a process that exits with such sockets) gives that data up, as a real
sender's kernel does: it is dropped here, never relayed."""

from __future__ import annotations

import contextlib
import errno
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
        self.dropped = 0  # connections whose held bytes were dropped because their client reset them
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
                    if a.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET:
                        self.dropped += 1  # the client gave up what it sent: lost with the partition
                        break
                    self._closed.wait(0.1)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                try:
                    for sock in readable:
                        data = sock.recv(65536)
                        if not data:
                            break
                        peers[sock].sendall(data)
                    else:
                        continue
                except OSError:  # reset by one side: the other is closed too
                    pass
                break
        with self._lock:
            self._open.discard(severed)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
