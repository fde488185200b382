"""One poll for the tests and benchmarks that wait on something outside them (an API server, processes, files):
a deadline read from the monotonic clock, never a fixed sleep, and a failure that says what was awaited."""

from __future__ import annotations

import contextlib
import os
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


def tree_bytes(*roots: str | os.PathLike) -> int:
    """The bytes of the files under `roots` (what a run has written so far: its logs, progress and checkpoints);
    files and folders removed meanwhile (a rotated checkpoint) are skipped."""
    total = 0
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(folder, name)).st_size
    return total


def wait_for_run(what: str, done: Callable[[], object], written: str | os.PathLike,
                 alive: Callable[[], bool] = lambda: True, stall: float = 300.0, limit: float = 1800.0,
                 tail: Callable[[], str] = lambda: "") -> None:
    """Waits until `done()` for a run that writes under `written`, for as long as it writes something: a run on a
    loaded machine starts and steps slowly, and no fixed deadline fits every machine. A run that ended first
    (`alive()` false) fails at once, saying `what` was awaited; one that wrote nothing for `stall` seconds (or
    took `limit` in all) raises NotWithin."""
    def finished() -> bool:
        if done():
            return True
        if not alive():
            raise AssertionError(f"{what}: the run ended first\n{tail()}")
        return False

    try:
        wait_while_progressing(finished, lambda: tree_bytes(written), stall, limit, tail)
    except NotWithin as exc:
        raise NotWithin(f"{what}: {exc}") from None
