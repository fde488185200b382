"""A port for a server that starts later (torchrun's rendezvous store a few seconds after we pick it).

The kernel's usual answer, bind to port 0, comes from the ephemeral range: the same range every outgoing
connection on the machine takes its source port from. Between our pick and the store's bind, any connection may
take the port (the store then fails with EADDRINUSE), and a node that connects to it before the store listens may
even connect to itself (TCP simultaneous open) and wait its whole rendezvous timeout for a store that is not there.
A port below the ephemeral range is never handed out by the kernel; the random pick keeps concurrent runs apart.
"""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000
ATTEMPTS = 200


def ephemeral_start(path: Path = EPHEMERAL_RANGE) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default when /proc cannot tell


def free_port(rng: random.Random | None = None, range_file: Path = EPHEMERAL_RANGE) -> int:
    """A port no one listens on now, outside the kernel's ephemeral range where it can be (else any free one)."""
    pick = rng or random.SystemRandom()
    top = ephemeral_start(range_file)
    if top > LOWEST + ATTEMPTS:
        for _ in range(ATTEMPTS):
            port = pick.randrange(LOWEST, top)
            if _bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as s:  # no SO_REUSEADDR: a port in TIME_WAIT is as good as taken for a new listener
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
