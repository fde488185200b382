"""Rank 0 -> FineTuneJob status: a merge patch of status.progress / status.checkpoint, rate-limited.

Uses the pod's ServiceAccount token and the in-cluster CA over plain HTTPS (no client library in the trainer
image). A failed report is logged and dropped: progress reporting must never stop training.
"""

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c

log = logging.getLogger(__name__)


@dataclass
class StatusReporter:
    server: str
    token: str
    namespace: str
    name: str
    ssl_context: ssl.SSLContext
    min_interval: float = 10.0
    # The FineTuneJob and attempt this trainer was started for, sent with every report as status.reporter: the
    # chart's admission policy refuses a report whose job UID or attempt is not the object's current one (an old
    # pod writing to a job deleted and created again under its name, or to its next attempt).
    uid: str | None = None
    attempt: int | None = None
    _last: float = float("-inf")
    failures: int = 0
    refused_as_stale: bool = False

    @classmethod
    def in_cluster(cls, namespace: str, name: str, uid: str | None = None, attempt: int | None = None
                   ) -> "StatusReporter | None":
        host, port = os.environ.get(c.ENV_KUBERNETES_SERVICE_HOST), os.environ.get(c.ENV_KUBERNETES_SERVICE_PORT, "443")
        sa_dir = os.environ.get(c.ENV_SERVICEACCOUNT_DIR, c.SERVICEACCOUNT_DIR)
        token_file = os.path.join(sa_dir, "token")
        if not host or not os.path.exists(token_file):
            return None
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
        context = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))
        return cls(f"https://{host}:{port}", token, namespace, name, context, uid=uid, attempt=attempt)

    @property
    def url(self) -> str:
        return f"{self.server}/apis/{c.API_VERSION}/namespaces/{self.namespace}/{c.PLURAL}/{self.name}/status"

    def due(self, force: bool = False) -> bool:
        """Whether report() would send now (not refused as stale; forced, or min_interval since the last one)."""
        return not self.refused_as_stale and (force or time.monotonic() - self._last >= self.min_interval)

    def report(self, status: dict[str, Any], force: bool = False) -> bool:
        """Sends the patch unless one was sent within min_interval (force: the final report). True if sent."""
        now = time.monotonic()
        if not self.due(force):
            return False
        self._last = now
        reporter = {"reporter": {"uid": self.uid, "attempt": self.attempt}} if self.uid else {}
        body = json.dumps({"status": {**status, **reporter}}).encode()
        request = urllib.request.Request(self.url, data=body, method="PATCH", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/merge-patch+json"})
        try:
            with urllib.request.urlopen(request, timeout=5, context=self.ssl_context) as response:
                return 200 <= response.status < 300
        except urllib.error.HTTPError as exc:
            self.failures += 1
            if exc.code in (403, 404, 422) and self.uid and "not the job" in _body(exc):  # not ours any more
                self.refused_as_stale = True
                log.warning("%s is no longer the FineTuneJob this trainer was started for (UID %s); no more "
                            "progress reports", self.url, self.uid)
            else:
                log.warning("progress report to %s failed (%s); training continues", self.url, exc)
            return False
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failures += 1
            log.warning("progress report to %s failed (%s); training continues", self.url, exc)
            return False


def _body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Warnings:
    """What a run warns about (a loss spike, a changed global batch, folded system prompts): logged on every rank,
    kept for the summary, and on rank 0 reported as status.notice, which the operator posts as a Warning Event, and
    written to the journal (notices.jsonl), which `finetune run` prints as it comes."""

    reporter: StatusReporter | None = None
    said: list[dict[str, str]] = field(default_factory=list)
    journal: Path | None = None  # rank 0's notices.jsonl

    def __call__(self, reason: str, message: str) -> None:
        log.warning("%s: %s", reason, message)
        notice = {"time": _utc_now(), "reason": reason, "message": message}
        self.said.append(notice)
        self._write({"time": notice["time"], "notice": notice})
        if self.reporter is not None:
            self.reporter.report({"notice": notice}, force=True)

    def note(self, text: str) -> None:
        """Something a user should read that is no warning (e.g. which checkpoint the run resumes from)."""
        log.info("%s", text)
        self._write({"time": _utc_now(), "note": text})

    def _write(self, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            with self.journal.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
