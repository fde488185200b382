"""Operator metrics for Prometheus (/metrics): jobs by phase, reconcile duration, restarts, API errors, goodput."""

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from ..api import exit_codes
from ..api.status import PHASES
from .observed import DISRUPTED, STORAGE_EXCEEDED, WAITING_REASONS

RECONCILE_SECONDS = Histogram("finetunejob_reconcile_duration_seconds", "Duration of one reconcile pass.",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
RESTARTS = Counter("finetunejob_gang_restarts_total", "Gang restarts started, by reason.", ["reason"])
# The reasons a gang restarts for, each served at 0 from the start: increase() and rate() count nothing for a series
# whose first sample is already 1, so the first OOMKilled restart of an operator's life would read 0 on the
# dashboard (a reason not listed here, e.g. one a trainer names itself, is counted from its second restart on).
RESTART_REASONS = (DISRUPTED, "OOMKilled", "Error", "Stalled", "PodFailed", STORAGE_EXCEEDED,
                   *sorted(r for code, r in exit_codes.REASONS.items()
                           if code not in (exit_codes.SUCCESS, exit_codes.INTERRUPTED)
                           and not exit_codes.is_permanent(code)))
for _reason in RESTART_REASONS:
    RESTARTS.labels(_reason)
API_ERRORS = Counter("finetunejob_api_errors_total", "Reconcile passes that failed on an API call.", ["status"])
JOBS = Gauge("finetunejob_jobs", "FineTuneJobs seen by this operator, by phase.", ["phase"])
WAITING = Gauge("finetunejob_jobs_waiting", "Pending FineTuneJobs by why their gang waits.", ["reason"])
# status.goodput's increments as this operator writes them (a restarted operator starts the counters again).
GPU_HOURS = Counter("finetunejob_gpu_hours_total", "GPU-hours of ended running periods of gangs.")
RESTART_DOWNTIME = Counter("finetunejob_restart_downtime_seconds_total",
                           "Seconds from failures until the gang ran again.")
STEPS_REDONE = Counter("finetunejob_steps_redone_total", "Optimizer steps done again after restarts.")
# Every metric we serve, in the order docs/reference/metrics.md lists them (controller/metrics_reference.py).
COLLECTORS = (JOBS, WAITING, RECONCILE_SECONDS, RESTARTS, API_ERRORS, GPU_HOURS, RESTART_DOWNTIME, STEPS_REDONE)


def count_goodput(before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    before, after = before or {}, after or {}
    for counter, key in ((GPU_HOURS, "gpuHours"), (RESTART_DOWNTIME, "restartDowntimeSeconds"),
                         (STEPS_REDONE, "stepsRedone")):
        delta = (after.get(key) or 0) - (before.get(key) or 0)
        if delta > 0:
            counter.inc(delta)


class JobTracker:
    """The last value (a phase, a waiting reason) of every job, so a gauge counts jobs, not reconcile passes."""

    def __init__(self, gauge: Gauge, values: tuple[str, ...]) -> None:
        self.gauge = gauge
        self.values: dict[tuple[str, str], str] = {}
        for name in values:
            gauge.labels(name).set(0)

    def set(self, key: tuple[str, str], value: str | None) -> None:
        before = self.values.pop(key, None) if value is None else self.values.get(key)
        if before == value:
            return
        if value is not None:
            self.values[key] = value
            self.gauge.labels(value).inc()
        if before is not None:
            self.gauge.labels(before).dec()


def phase_tracker() -> JobTracker:
    return JobTracker(JOBS, PHASES)


def waiting_tracker() -> JobTracker:
    return JobTracker(WAITING, WAITING_REASONS)


def serve(port: int) -> None:
    start_http_server(port)
