"""Writes only while this replica leads: the write fence every operator request to the API server goes through.

With two replicas one may write; "I still lead" is only true as long as the Lease was renewed recently, measured on
this process's own monotonic clock (leadership.py keeps `renewed_at`: when the last renewal that succeeded was
*sent*, so the Lease cannot have been written earlier than that). Every write (POST, PUT, PATCH, DELETE) is checked
at the last moment, when its bytes are handed to the socket: a leader frozen (SIGSTOP, a long GC, a VM pause) and
resumed after a standby took over finds its renewal too old and sends nothing; a write whose check passed goes out
at once. A write that has not been answered within `write_timeout` is abandoned with a TCP reset (SO_LINGER 0): its
bytes, if a partition held them, are dropped instead of landing later, and the same holds for every connection when
the process exits. leadership.Timing keeps renew deadline + write timeout below the lease duration, so a write
sent by a leader lands before anyone else may lead, or never.

No client-level retries of writes either: urllib3 resends a timed-out PUT or DELETE by itself (its default), which
lands late or conflicts with its own first copy (issue 41: a renewal answered 504, resent, then 409 against itself).
Reads are still retried; a write whose connection failed is retried only when nothing was sent. A pass that fails is
retried by the controller, with fresh state.
"""

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

READS = frozenset({"GET", "HEAD", "OPTIONS"})
# close() sends a reset and drops what is unsent, instead of a FIN after which the kernel keeps retransmitting it.
ABORT_ON_CLOSE = (socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class NotLeading(HTTPError):
    """A write refused before it left: this replica's lease is not fresh (or it was handed over)."""


@dataclass
class Fence:
    """`renew_deadline` None: no leader election (one replica), every write goes. `write_timeout` bounds each write
    when set (else the request's own timeout applies)."""
    renew_deadline: float | None = None
    write_timeout: float | None = None
    clock: Callable[[], float] = time.monotonic
    renewed_at: float | None = None  # our clock: when the last successful renewal (or acquisition) was sent
    released: bool = False
    refused: int = field(default=0)  # writes stopped here (for the logs and tests)

    def lead(self, renew_deadline: float, write_timeout: float) -> None:
        self.renew_deadline, self.write_timeout = renew_deadline, write_timeout

    def renewed(self, sent_at: float) -> None:
        if self.renewed_at is None or sent_at > self.renewed_at:
            self.renewed_at = sent_at

    def release(self) -> None:
        """The Lease is being handed over: nothing may be written from now on."""
        self.released = True

    def age(self) -> float | None:
        return None if self.renewed_at is None else self.clock() - self.renewed_at

    def check(self) -> None:
        """Raises NotLeading unless a write may go now."""
        if self.released:
            self.refused += 1
            raise NotLeading("the Lease was handed over: this replica writes nothing more")
        if self.renew_deadline is None:
            return
        age = self.age()
        if age is None or age >= self.renew_deadline:
            self.refused += 1
            raise NotLeading(f"the Lease was last renewed {'never' if age is None else f'{age:.1f} s ago'} "
                             f"(renew deadline {self.renew_deadline:g} s): this replica may no longer write")


FENCE = Fence()  # one per process: main.py arms it when it leads through a Lease


class _FencedMixin:
    """The check sits in send(): after the connection (and TLS) is up and the request built, just before each of
    its chunks goes to the socket. A request cut between headers and body is incomplete, and the reset drops it."""
    fence: Fence = FENCE
    _writes = False

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:
        self._writes = method.upper() not in READS
        super().request(method, url, *args, **kwargs)  # type: ignore[misc]

    def send(self, data: Any) -> None:
        if self._writes:
            self.fence.check()
        super().send(data)  # type: ignore[misc]


class FencedHTTPConnection(_FencedMixin, HTTPConnection):
    pass


class FencedHTTPSConnection(_FencedMixin, HTTPSConnection):
    pass


class FencedHTTPPool(HTTPConnectionPool):
    ConnectionCls = FencedHTTPConnection


class FencedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = FencedHTTPSConnection


def _pool_fenced_by(pool: type[HTTPConnectionPool], fence: Fence) -> type[HTTPConnectionPool]:
    """A subclass of `pool` whose connections pass `fence` (a fence of this client's own, not the module's)."""
    connection = type(pool.ConnectionCls.__name__, (pool.ConnectionCls,), {"fence": fence})

    class Pool(pool):  # type: ignore[valid-type, misc]
        ConnectionCls = connection

    Pool.__name__ = Pool.__qualname__ = pool.__name__
    return Pool


def fenced_configuration(configuration: client.Configuration, retry_reads: int = 3) -> client.Configuration:
    """Client retries of reads (and of connections that never sent a byte) only, and connections that reset on
    close (set before the ApiClient is made)."""
    configuration.retries = Retry(total=retry_reads, allowed_methods=READS, redirect=False) if retry_reads else False
    configuration.socket_options = [*HTTPConnection.default_socket_options, ABORT_ON_CLOSE]
    return configuration


def fence_client(api_client: client.ApiClient, timeout: tuple[float, float], fence: Fence = FENCE) -> None:
    """Every request of `api_client` without a timeout of its own gets `timeout` (a write: the fence's write timeout
    when it has one), and every write passes `fence` first. The client's configuration must come from
    fenced_configuration()."""
    rest = api_client.rest_client
    manager = rest.pool_manager
    fenced = {"http": _pool_fenced_by(FencedHTTPPool, fence), "https": _pool_fenced_by(FencedHTTPSPool, fence)}
    manager.pool_classes_by_scheme = fenced
    manager.clear()  # pools made before this (none, normally) would keep the plain connection class
    request = rest.request

    def bounded(method: str, url: str, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        if _request_timeout is None:
            _request_timeout = fence.write_timeout if method.upper() not in READS and fence.write_timeout else timeout
        return request(method, url, *args, _request_timeout=_request_timeout, **kwargs)

    rest.request = bounded
