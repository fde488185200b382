"""Writes the operator has made and not yet seen come back on a watch.

Caches lag the API by the watch delay. Without this memory a pass that runs in that window (another pod event,
a timer) would see no Job for the attempt it just created and apply the children again: harmless (server-side
apply is idempotent) but a second set of writes per job, which the request budget at scale does not allow. The
same pattern as the Kubernetes controllers' ControllerExpectations: trust our own write until the watch shows it
(or a TTL passes), then look again.
"""

import time
from collections.abc import Callable, Hashable

# Long enough for a watch that lags by a minute under a thousand-job burst; writes that the cache shows are
# forgotten at once (reconcile.py), so this only bounds how long a lost write waits to be retried.
DEFAULT_TTL_SECONDS = 300.0


class Expectations:
    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.ttl, self.clock = ttl_seconds, clock
        self._done: dict[Hashable, float] = {}
        # The last refusal of an attempt's children, by job: (attempt, reason, message): the apiserver's answer
        # (AttemptRefused) or a child's name taken by an object not ours (NameConflict). Nothing watched shows a
        # write that never happened, so the next pass learns it here and says it in the job's status.
        self.refused: dict[Hashable, tuple[int, str, str]] = {}

    def pending(self, key: Hashable) -> bool:
        """True while a write for `key` was made recently enough that the cache may not show it yet."""
        if key not in self._done:
            return False
        if self.clock() >= self._done[key]:
            del self._done[key]
            return False
        return True

    def record(self, key: Hashable, ttl_seconds: float | None = None) -> None:
        """After a successful write; a longer ttl for namespace infrastructure that nothing else watches."""
        self._done[key] = self.clock() + (self.ttl if ttl_seconds is None else ttl_seconds)
        if len(self._done) % 1024 == 0:  # keys of deleted jobs are never asked again: drop them now and then
            self.sweep()

    def forget(self, key: Hashable) -> None:
        self._done.pop(key, None)

    def forget_matching(self, predicate: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._done if predicate(k)]:
            del self._done[key]

    def sweep(self) -> None:
        now = self.clock()
        for key in [k for k, t in self._done.items() if now >= t]:
            del self._done[key]
