"""A server started on a port picked beforehand may lose it, between the pick and its bind, to any process that
binds the same number (free_port picks at random below the kernel's ephemeral range: other workers' servers do
the same). A busy run of the suite lost a worker's whole control plane that way (etcd: "bind: address already in
use") and with it 139 cluster tests. The server is started again on new ports; any other failure is raised."""

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
ATTEMPTS = 5


TAKEN = ("address already in use", "port is already in use")  # Go's net package; MinIO's own words


def port_taken(error: BaseException) -> bool:
    return any(words in str(error).lower() for words in TAKEN)


def start_on_free_ports(start: Callable[[], T], forget: Callable[[], None], attempts: int = ATTEMPTS) -> T:
    """`start()` picks its ports and starts the server; after a start that lost a port, `forget()` clears what it
    left (a stopped process, a half-made data directory, its log) and it is tried again."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except RuntimeError as exc:
            if attempt == attempts or not port_taken(exc):
                raise
            forget()
    raise AssertionError("unreachable")


def set_aside(log: Path) -> None:
    """Renames a start's log that lost its port, so the next start's log says only its own story."""
    if log.exists():
        log.rename(log.with_suffix(f".port-taken-{time.time_ns()}.log"))
