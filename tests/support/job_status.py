"""Waiting on a FineTuneJob's status from the cluster tests, as a user watching `kubectl get ftj` would."""

import time
from collections.abc import Callable
from typing import Any


def wait_status(kubectl: Any, ns: str, name: str, predicate: Callable[[dict], bool], op: Any,
                timeout: float = 60.0) -> dict:
    """The job's status once `predicate` holds; on timeout, the last status and the operator's log tail."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = kubectl.json("get", "ftj", name, "-n", ns).get("status") or {}
        if predicate(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"not reached in {timeout}s: {last}\n{op.log_tail(30)}")
