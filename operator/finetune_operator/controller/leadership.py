"""Leader election on a coordination.k8s.io Lease, as controller-runtime and client-go do it, so the chart can run
two replicas with one writer.

- A standby takes the Lease only after it has seen the same record (holder, renew time, resourceVersion) for a
  whole lease duration on its own clock: no trust in the other pod's clock.
- The leader renews every `retry` seconds; when it has not managed to for `renew_deadline` (shorter than the lease,
  so it stops before anyone may take over) it calls `on_lost`, which exits the process: never two writers.
- A leader that stops cleanly empties the holder, so the standby takes over within one retry, not one lease.
Every write carries the resourceVersion it read: two standbys racing for an expired Lease cannot both win.
"""

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

log = logging.getLogger("finetune_operator.leadership")


@dataclass(frozen=True)
class Timing:
    """controller-runtime's defaults are 15/10/2 s; ours are shorter so a failover fits in 15 s with room."""
    lease_seconds: int = 8
    renew_deadline: float = 6.0
    retry: float = 1.0
    request_timeout: float = 2.0  # a hung connection must not outlast the renew deadline


def _now() -> datetime:
    return datetime.now(UTC)


class LeaseElector:
    def __init__(self, api: client.CoordinationV1Api, namespace: str, name: str, identity: str,
                 timing: Timing = Timing(), clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.timing, self.clock = timing, clock
        self._observed: tuple[Any, ...] | None = None  # the last record seen, and when (our clock)
        self._observed_at = 0.0
        self.last_renewed: float | None = None  # our clock, while we hold the Lease
        self._timeout = {"_request_timeout": timing.request_timeout}

    def try_acquire_or_renew(self) -> bool:
        """One round: True when we hold the Lease afterwards."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create()
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, lease.metadata.resource_version)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or self.timing.lease_seconds
        if holder and holder != self.identity and self.clock() - self._observed_at < duration:
            return False
        now = _now()
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity, spec.renew_time = self.identity, now
        spec.lease_duration_seconds = self.timing.lease_seconds
        try:
            # The body carries the resourceVersion read: a write in between makes this a 409.
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, **self._timeout)
        except ApiException as exc:
            if exc.status == 409:  # someone wrote in between: they won this round
                return False
            raise
        if holder != self.identity:
            log.warning("leader election: %s now leads (Lease %s/%s; was %s)", self.identity, self.namespace,
                        self.name, holder or "nobody")
        self.last_renewed = self.clock()
        return True

    def _create(self) -> bool:
        now = _now()
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                              spec=client.V1LeaseSpec(holder_identity=self.identity, acquire_time=now, renew_time=now,
                                                      lease_duration_seconds=self.timing.lease_seconds,
                                                      lease_transitions=0))
        try:
            self.api.create_namespaced_lease(self.namespace, body, **self._timeout)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        log.warning("leader election: %s leads (created Lease %s/%s)", self.identity, self.namespace, self.name)
        self.last_renewed = self.clock()
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Blocks until we lead (True) or `stop` is set (False). API errors are retried: a standby waits."""
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    return True
            except (ApiException, HTTPError, OSError) as exc:
                log.warning("leader election: cannot read or write Lease %s/%s (%s); retrying", self.namespace,
                            self.name, exc)
            if not announced:
                log.warning("leader election: %s is standby; %s leads", self.identity,
                            self._observed[0] if self._observed else "?")
                announced = True
            stop.wait(self.timing.retry)
        return False

    def hold(self, stop: threading.Event, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renews in a daemon thread until `stop`; calls `on_lost(why)` once the Lease is lost or not renewed
        within the renew deadline."""
        def renew() -> None:
            while not stop.wait(self.timing.retry):
                try:
                    if not self.try_acquire_or_renew():
                        on_lost(f"another replica holds Lease {self.namespace}/{self.name}")
                        return
                except (ApiException, HTTPError, OSError) as exc:
                    log.warning("leader election: renewing Lease %s/%s failed (%s)", self.namespace, self.name, exc)
                if self.last_renewed is not None and self.clock() - self.last_renewed > self.timing.renew_deadline:
                    on_lost(f"Lease {self.namespace}/{self.name} not renewed for {self.timing.renew_deadline:g} s")
                    return

        thread = threading.Thread(target=renew, name="lease-renew", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Hands the Lease over at once (clean shutdown): the holder emptied, so a standby need not wait it out."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **self._timeout)
            if lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity, lease.spec.lease_duration_seconds = None, 1
            lease.spec.renew_time = _now()
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, **self._timeout)
            log.warning("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
        except (ApiException, HTTPError, OSError) as exc:
            log.warning("leader election: could not release Lease %s/%s (%s); it expires in %d s", self.namespace,
                        self.name, exc, self.timing.lease_seconds)
