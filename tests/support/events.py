"""Events as the tests read them: waited for, never read once. The operator writes an Event apart from the status
it goes with (and the apiserver lists Events from its watch cache), so a read right after the status reads true
can come too early on a loaded machine."""

from __future__ import annotations

import time
from typing import Any


def events_of(kubectl: Any, ns: str, *, name: str | None = None, reason: str | None = None,
              kind: str | None = None) -> list[dict]:
    selector = [f"involvedObject.kind={kind}"] if kind else []
    selector += [f"involvedObject.name={name}"] if name else []
    selector += [f"reason={reason}"] if reason else []
    args = ["--field-selector", ",".join(selector)] if selector else []
    return kubectl.json("get", "events", "-n", ns, *args)["items"]


def wait_events(kubectl: Any, ns: str, *, name: str | None = None, reason: str | None = None,
                kind: str | None = None, type_: str | None = None, timeout: float = 30.0, op: Any = None,
                ) -> list[dict]:
    """The matching Events once there is at least one (of `type_` when given); on timeout, what there was and the
    operator's log tail."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in events_of(kubectl, ns, name=name, reason=reason, kind=kind)
                 if type_ is None or e["type"] == type_]
        if found:
            return found
        if time.monotonic() > deadline:
            seen = [(e["type"], e["reason"]) for e in events_of(kubectl, ns, name=name, kind=kind)]
            raise AssertionError(f"no {type_ or ''} Event {reason or ''} for {name or ns} in {timeout}s; there "
                                 f"were: {seen}\n{op.log_tail(30) if op else ''}")
        time.sleep(0.5)
