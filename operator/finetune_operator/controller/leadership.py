"""Leader election on a coordination.k8s.io Lease, as controller-runtime and client-go do it, so the chart can run
two replicas with one writer.

- A standby takes the Lease only after it has seen the same record (holder, renew time, resourceVersion) for a
  whole lease duration on its own clock: no trust in the other pod's clock.
- The leader renews every `retry` seconds. A renewal counts from when it was *sent* (it cannot have landed
  earlier), and every write of the operator is fenced on it (fencing.py): none leaves once the last renewal is
  `renew_deadline` old, on this process's monotonic clock, whatever the renewal thread is doing (blocked, starved,
  or frozen with the rest of the process by SIGSTOP). Each Lease request is bounded by the time left before that
  deadline, and a leader that reaches it calls `on_lost`, which exits the process: it steps down before its Lease
  can expire, and never two writers.
- A 409 on our own renewal is not taken for another holder: the Lease is read again, and only another holder's
  name ends the lead (a renewal whose answer was lost, then resent, conflicts with itself).
- A leader that stops cleanly closes its fence, then empties the holder, so the standby takes over within one retry,
  not one lease.
Every write carries the resourceVersion it read: two standbys racing for an expired Lease cannot both win.
"""

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from .fencing import Fence

log = logging.getLogger("finetune_operator.leadership")


class LeaseContended(Exception):
    """Our write met a 409 and a fresh read named no other holder: nothing is concluded, the round is retried."""


RETRIED = (ApiException, HTTPError, OSError, LeaseContended)


@dataclass(frozen=True)
class Timing:
    """controller-runtime's defaults are 15/10/2 s; ours are shorter so a failover fits in 15 s with room.

    What makes one writer at a time: a write leaves at most `renew_deadline` after the renewal it relies on was
    sent, and lands within `write_timeout` or is abandoned (fencing.py); a standby takes over no sooner than
    `lease_seconds` after that renewal landed. `margin` is for clocks that tick at slightly different rates and the
    apiserver's own latency."""
    lease_seconds: int = 10
    renew_deadline: float = 6.0
    retry: float = 1.0
    request_timeout: float = 2.0  # one Lease request, cut to the time left before the renew deadline
    write_timeout: float = 3.0  # one write of the operator's (fencing.py)
    margin: float = 1.0

    def __post_init__(self) -> None:
        if self.renew_deadline + self.write_timeout + self.margin > self.lease_seconds:
            raise ValueError(f"renew deadline {self.renew_deadline:g} s + write timeout {self.write_timeout:g} s + "
                             f"margin {self.margin:g} s must fit in the lease ({self.lease_seconds} s): a write "
                             "could land after another replica took the Lease")
        if self.retry >= self.renew_deadline:
            raise ValueError(f"retry {self.retry:g} s must be shorter than the renew deadline "
                             f"{self.renew_deadline:g} s")


def _now() -> datetime:
    return datetime.now(UTC)


class LeaseElector:
    def __init__(self, api: client.CoordinationV1Api, namespace: str, name: str, identity: str,
                 timing: Timing = Timing(), clock: Callable[[], float] = time.monotonic, fence: Fence | None = None):
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.timing, self.clock, self.fence = timing, clock, fence
        self._observed: tuple[Any, ...] | None = None  # the last record seen, and when (our clock)
        self._observed_at = 0.0
        self._held: client.V1Lease | None = None  # the Lease as we last wrote it, while we hold it
        self.last_renewed: float | None = None  # our clock: when the last renewal that succeeded was sent
        self.self_conflicts = 0  # 409s on our own renewal that a fresh read showed to be ours

    # --- one round --------------------------------------------------------------------------------------------
    def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One round: True when we hold the Lease afterwards, False when another replica does. API errors are
        raised (nothing is concluded from them). `deadline` (our clock) bounds every request of the round."""
        if self._held is not None:  # renewing: one PUT on the resourceVersion we wrote last, no read first
            outcome = self._put(self._held, deadline, acquiring=False)
            if outcome is not None:
                return outcome
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout(deadline))
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(deadline)
        return self._decide(lease, deadline)

    def _decide(self, lease: client.V1Lease, deadline: float | None) -> bool:
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, lease.metadata.resource_version)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or self.timing.lease_seconds
        if holder and holder != self.identity and self.clock() - self._observed_at < duration:
            self._held = None
            return False
        outcome = self._put(lease, deadline, acquiring=holder != self.identity)
        if outcome is None:  # a 409 again, though the Lease was just read: someone is writing it now
            raise LeaseContended(f"Lease {self.namespace}/{self.name} changed twice under one round")
        return outcome

    def _put(self, lease: client.V1Lease, deadline: float | None, acquiring: bool) -> bool | None:
        """Writes our record over `lease` (its resourceVersion). True: we hold it; False: a fresh read shows another
        holder; None: a conflict that a read found no answer to (the caller reads and decides again)."""
        body = copy.deepcopy(lease)
        spec, now = body.spec, _now()
        was = spec.holder_identity
        if acquiring:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity, spec.renew_time = self.identity, now
        spec.lease_duration_seconds = self.timing.lease_seconds
        sent = self.clock()
        try:
            # The body carries the resourceVersion read: a write in between makes this a 409.
            written = self.api.replace_namespaced_lease(self.name, self.namespace, body, **self._timeout(deadline))
        except ApiException as exc:
            if exc.status != 409:
                raise
            return self._after_conflict(now, sent, deadline)
        if acquiring:
            log.warning("leader election: %s now leads (Lease %s/%s; was %s)", self.identity, self.namespace,
                        self.name, was or "nobody")
        self._holding(written, sent)
        return True

    def _after_conflict(self, renew_time: datetime, sent: float, deadline: float | None) -> bool | None:
        """A 409 on our write: read who holds the Lease before concluding anything. Our own record there (this
        very renew time) means the write landed after all: an answer lost and the request sent again."""
        lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout(deadline))
        spec = lease.spec
        if spec.holder_identity == self.identity and spec.renew_time == renew_time:
            self.self_conflicts += 1
            log.warning("leader election: a renewal of Lease %s/%s conflicted with itself (sent twice); still held",
                        self.namespace, self.name)
            self._holding(lease, sent)
            return True
        if spec.holder_identity and spec.holder_identity != self.identity:
            self._held = None
            record = (spec.holder_identity, spec.renew_time, lease.metadata.resource_version)
            if record != self._observed:
                self._observed, self._observed_at = record, self.clock()
            return False
        self._held = lease if spec.holder_identity == self.identity else None
        return None

    def _holding(self, lease: client.V1Lease, sent: float) -> None:
        self._held = lease
        self.last_renewed = sent if self.last_renewed is None else max(self.last_renewed, sent)
        if self.fence is not None:
            self.fence.renewed(sent)

    def _create(self, deadline: float | None) -> bool:
        now = _now()
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                              spec=client.V1LeaseSpec(holder_identity=self.identity, acquire_time=now, renew_time=now,
                                                      lease_duration_seconds=self.timing.lease_seconds,
                                                      lease_transitions=0))
        sent = self.clock()
        try:
            written = self.api.create_namespaced_lease(self.namespace, body, **self._timeout(deadline))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        log.warning("leader election: %s leads (created Lease %s/%s)", self.identity, self.namespace, self.name)
        self._holding(written, sent)
        return True

    def _timeout(self, deadline: float | None) -> dict[str, float]:
        timeout = self.timing.request_timeout
        if deadline is not None:
            timeout = min(timeout, max(deadline - self.clock(), 0.05))
        return {"_request_timeout": timeout}

    # --- standby and leader -----------------------------------------------------------------------------------
    def acquire(self, stop: threading.Event) -> bool:
        """Blocks until we lead (True) or `stop` is set (False). API errors are retried: a standby waits."""
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    if self.fence is not None:
                        self.fence.lead(self.timing.renew_deadline, self.timing.write_timeout)
                    return True
            except RETRIED as exc:
                log.warning("leader election: cannot read or write Lease %s/%s (%s); retrying", self.namespace,
                            self.name, exc)
            if not announced:
                log.warning("leader election: %s is standby; %s leads", self.identity,
                            self._observed[0] if self._observed else "?")
                announced = True
            stop.wait(self.timing.retry)
        return False

    def hold(self, stop: threading.Event, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renews in a daemon thread until `stop`; calls `on_lost(why)` once another replica holds the Lease (read,
        not guessed from a conflict) or it was not renewed within the renew deadline. Each attempt's requests end
        by that deadline, so the step-down is on time even when the API server does not answer."""
        def renew() -> None:
            while not stop.wait(self.timing.retry):
                assert self.last_renewed is not None
                deadline = self.last_renewed + self.timing.renew_deadline
                try:
                    if self.clock() < deadline and not self.try_acquire_or_renew(deadline):
                        on_lost(f"another replica ({self._observed[0] if self._observed else '?'}) holds Lease "
                                f"{self.namespace}/{self.name}")
                        return
                except RETRIED as exc:
                    log.warning("leader election: renewing Lease %s/%s failed (%s); last renewed %.1f s ago",
                                self.namespace, self.name, exc, self.clock() - self.last_renewed)
                if self.clock() - self.last_renewed >= self.timing.renew_deadline:
                    on_lost(f"Lease {self.namespace}/{self.name} not renewed for {self.timing.renew_deadline:g} s")
                    return

        thread = threading.Thread(target=renew, name="lease-renew", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Hands the Lease over at once (clean shutdown): the fence closed first, then the holder emptied, so a
        standby need not wait it out."""
        if self.fence is not None:
            self.fence.release()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout(None))
            if lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity, lease.spec.lease_duration_seconds = None, 1
            lease.spec.renew_time = _now()
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, **self._timeout(None))
            log.warning("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
        except (ApiException, HTTPError, OSError) as exc:
            log.warning("leader election: could not release Lease %s/%s (%s); it expires in %d s", self.namespace,
                        self.name, exc, self.timing.lease_seconds)
