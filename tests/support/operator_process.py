"""The operator as a real process (python -m finetune_operator.controller: kopf behind our health endpoint and
leader election), against the test control plane."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.controlplane import ROOT


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, restart_backoff: float = 1.0, metrics_port: int = 0,
                 workers: int = 16, env: dict[str, str] | None = None, args: tuple[str, ...] = ("--health-port=0",),
                 namespaces: tuple[str, ...] = ()):
        self.kubeconfig, self.log_path, self.restart_backoff = kubeconfig, log_path, restart_backoff
        self.metrics_port, self.workers, self.env, self.args = metrics_port, workers, env or {}, args
        # Every namespace (the chart's default), or only these (its watchNamespaces)
        self.scope = [f"--namespace={ns}" for ns in namespaces] or ["--all-namespaces"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               "FINETUNE_RESTART_BACKOFF_SECONDS": str(self.restart_backoff),
               "FINETUNE_METRICS_PORT": str(self.metrics_port), "FINETUNE_WORKERS": str(self.workers),
               "PYTHONWARNINGS": "ignore:Unverified HTTPS request",  # the loopback apiserver's self-signed cert
               "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")]), **self.env}
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "finetune_operator.controller", *self.scope, *self.args],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        """SIGKILL: no clean-up, as a crashed or evicted operator."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()

    @staticmethod
    def memory(pid: int) -> dict[str, int]:
        """VmRSS and VmHWM (peak resident set) in KiB, from /proc."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def refusals(self) -> list[str]:
        """The log records (a record: its first line and what follows, e.g. a traceback) that tell of a request
        refused as Forbidden for another reason than its namespace being deleted: a right the identity lacks.
        (A namespace being deleted refuses new objects to every identity; the body that says so is lines below the
        record's "Reason: Forbidden".)"""
        # The whole log: a window of its last lines once began inside a record, and that record's traceback was
        # judged without the response body below it that says why.
        records = RECORD_START.split(self.log_path.read_text(errors="replace"))
        return [r for r in records if "orbidden" in r and "because it is being terminated" not in r]


RECORD_START = re.compile(r"\n(?=\[\d{4}-\d\d-\d\d )")  # kopf's log format: [2026-11-26 20:01:53,166] logger ...
