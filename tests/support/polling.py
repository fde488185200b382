"""One poll for the tests and benchmarks that wait on something outside them (an API server, processes, files):
a deadline read from the monotonic clock, never a fixed sleep, and a failure that says what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class NotWithin(AssertionError):
    """What was awaited did not come before the deadline."""


def wait_until(what: str, predicate: Callable[[], T], timeout: float = 60.0, every: float = 0.2) -> T:
    """Calls `predicate` every `every` seconds until it returns something truthy, and returns that; raises NotWithin
    naming `what` once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise NotWithin(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def wait_while_progressing(done: Callable[[], bool], progress: Callable[[], object], stall: float,
                           limit: float = float("inf"), tail: Callable[[], str] = lambda: "",
                           every: float = 0.5) -> None:
    """Waits until `done()`, for as long as `progress()` (e.g. the bytes a run has logged) keeps changing: a loaded
    machine makes a run slow, not silent. Unchanged for `stall` seconds, or `limit` in all, raises NotWithin with
    `tail()` (the run's last output), so a hang says where it hung."""
    started = quiet_since = time.monotonic()
    last: object = object()
    while not done():
        now = time.monotonic()
        value = progress()
        if value != last:
            last, quiet_since = value, now
        if now - quiet_since > stall or now - started > limit:
            raise NotWithin(f"nothing new for {now - quiet_since:.0f} s ({now - started:.0f} s in all):\n{tail()}")
        time.sleep(every)
