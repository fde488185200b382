"""Counting the operator's API requests from the apiserver's audit log (one JSON event per completed request)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from tests.support.controlplane import AUDITED_USER

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def received(event: dict) -> float:
    """When the apiserver received the request, in epoch seconds."""
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


def accepted(event: dict) -> bool:
    """The request was carried out: one refused (by an admission policy, say) wrote nothing."""
    return int((event.get("responseStatus") or {}).get("code", 200)) < 400


def events(log: Path, start: float = 0.0, end: float = float("inf"), namespace: str | None = None,
           user: str = AUDITED_USER) -> Iterator[dict]:
    """`user`'s completed requests received in [start, end) (epoch seconds); with `namespace`, only those about
    objects in it (watches and lists across namespaces have none)."""
    if not log.exists():
        return
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete" or event.get("user", {}).get("username") != user:
                continue
            if namespace is not None and (event.get("objectRef") or {}).get("namespace") != namespace:
                continue
            if start <= received(event) < end:
                yield event


def requests(log: Path, start: float = 0.0, end: float = float("inf"), namespace: str | None = None,
             user: str = AUDITED_USER) -> Counter[tuple[str, str]]:
    """(verb, resource[/subresource]) -> count, over events(...)."""
    counts: Counter[tuple[str, str]] = Counter()
    for event in events(log, start, end, namespace, user):
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", event.get("requestURI", "?"))
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        counts[(event["verb"], resource)] += 1
    return counts


def writes(counts: Counter[tuple[str, str]]) -> int:
    return sum(n for (verb, _), n in counts.items() if verb in WRITE_VERBS)


def table(counts: Counter[tuple[str, str]], per: float = 1.0) -> str:
    rows = sorted(counts.items(), key=lambda kv: (kv[0][0] not in WRITE_VERBS, kv[0]))
    return "\n".join(f"  {verb:<8}{resource:<32}{n:>8}{n / per:>10.2f}" for (verb, resource), n in rows)
