"""Whether the other nodes are still tokenizing, so rank 0's heartbeat speaks for them only while they are alive.

With a cache of each node's own, every node's first process tokenizes the data while rank 0 reports the `Preparing`
heartbeat and then waits for them in a barrier of DATA_BARRIER_TIMEOUT (24 h). A node whose process hung (a
deadlock, a frozen container, a GIL held in native code) would leave that heartbeat going for a day, and the
operator's stall watchdog would never hear that anything was wrong. So each such process counts its own beats in
the job's rendezvous store (torch's c10d store, which every process already shares), and rank 0 stops its heartbeat
while one of them has not counted for PEER_SILENT_SECONDS: the watchdog (runPolicy.stallTimeoutSeconds) then
restarts the gang as for any stall. A process that finished says so, and is not watched any more.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)
PEER_BEAT_SECONDS = 10.0
# Far above any pause of a working process's threads (a Python thread gets the GIL every few milliseconds), far
# below the watchdog's default 1800 s.
PEER_SILENT_SECONDS = 300.0


def _key(rank: int, what: str) -> str:
    # Per restart of the worker group: an in-place restart (torchrun's) keeps the store, and a done mark of the
    # previous group's must not speak for this one.
    return f"finetune/preparing/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}/{what}"


def default_store() -> Any | None:
    """The process group's store (the rendezvous's TCPStore), or None without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def watched_ranks(world_size: int, local_world_size: int) -> list[int]:
    """The first process of every node but rank 0's: the ones that tokenize into a cache of their node's own."""
    step = max(1, local_world_size)
    return list(range(step, world_size, step))


class NodeBeat:
    """In a node's first process (not rank 0) while it tokenizes: counts a beat every `interval`, and marks the
    work done at the end (also when it raises: its exit is then the group's failure, not a silence)."""

    def __init__(self, store: Any, rank: int, interval: float = PEER_BEAT_SECONDS):
        self.store, self.rank, self.interval = store, rank, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preparing-node-beat", daemon=True)

    def _count(self, what: str) -> None:
        try:
            self.store.add(_key(self.rank, what), 1)
        except Exception as exc:  # the store away: the group is failing anyway, and says so elsewhere
            log.debug("cannot count a beat in the rendezvous store: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._count("beats")

    def __enter__(self) -> "NodeBeat":
        self._count("beats")
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._count("done")


class PeerWatch:
    """On rank 0: the watched processes that have neither beaten nor finished for `silent_after` seconds."""

    def __init__(self, store: Any, ranks: Iterable[int], silent_after: float = PEER_SILENT_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.store, self.silent_after, self.clock = store, silent_after, clock
        now = clock()
        # rank -> (beats counted, when that count was first seen); a rank not heard from yet counts from now.
        self._seen: dict[int, tuple[int, float]] = {rank: (0, now) for rank in ranks}

    def silent(self) -> dict[int, float]:
        """{rank: seconds since it was last heard from} of those over the limit. add(key, 0) reads a counter
        without waiting for it (get() would block until a key exists)."""
        now, quiet = self.clock(), {}
        for rank, (beats, since) in list(self._seen.items()):
            if self.store.add(_key(rank, "done"), 0) > 0:
                del self._seen[rank]
                continue
            counted = self.store.add(_key(rank, "beats"), 0)
            if counted != beats:
                self._seen[rank] = (counted, now)
            elif now - since >= self.silent_after:
                quiet[rank] = now - since
        return quiet
