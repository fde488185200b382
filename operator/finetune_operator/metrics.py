"""Operator metrics for Prometheus (/metrics): jobs by phase, reconcile duration, restarts, API errors."""

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from .api.status import PHASES

RECONCILE_SECONDS = Histogram("finetunejob_reconcile_duration_seconds", "Duration of one reconcile pass.",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
RESTARTS = Counter("finetunejob_gang_restarts_total", "Gang restarts started, by reason.", ["reason"])
API_ERRORS = Counter("finetunejob_api_errors_total", "Reconcile passes that failed on an API call.", ["status"])
JOBS = Gauge("finetunejob_jobs", "FineTuneJobs seen by this operator, by phase.", ["phase"])


class PhaseTracker:
    """The last phase of every job, so the gauge counts jobs, not reconcile passes."""

    def __init__(self) -> None:
        self.phases: dict[tuple[str, str], str] = {}
        for name in PHASES:
            JOBS.labels(name).set(0)

    def set(self, key: tuple[str, str], phase: str | None) -> None:
        before = self.phases.pop(key, None) if phase is None else self.phases.get(key)
        if before == phase:
            return
        if phase is not None:
            self.phases[key] = phase
            JOBS.labels(phase).inc()
        if before is not None:
            JOBS.labels(before).dec()


def serve(port: int) -> None:
    start_http_server(port)
