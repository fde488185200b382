"""The chart's Grafana dashboard against a real operator: every panel's queries run by Prometheus' PromQL engine
over scrapes of the operator's /metrics while jobs go through their lives (a restarted gang, a gang that cannot
be placed, a finished GPU job, a deadline), then the dashboard is drawn from the results (tests/support/
dashboard.py). FINETUNE_WRITE_DOCS_IMAGES=1 also writes the picture the monitoring docs show."""

import json
import os
import time
import urllib.request

from tests.cluster.test_operator import attempt_pods, running, submit, terminate, wait_for, wait_phase
from tests.conftest import ROOT
from tests.support.dashboard import DASHBOARD, Scraper, draw, evaluate, panel_queries
from tests.support.job_status import wait_status
from tests.support.minio import build_components

DOCS_IMAGE = ROOT / "docs" / "operations" / "dashboard.png"


def test_every_panel_reads_the_operator_and_the_dashboard_is_drawn(kubectl, operator, namespace, tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    wait_for(lambda: answers(url), what=f"{url} answering", op=operator)  # the operator may still be starting
    with Scraper(url, every=1.0) as scraper:
        time.sleep(3)
        submit(kubectl, namespace, "steady")
        submit(kubectl, namespace, "restarted", **{"spec.runPolicy.backoffLimit": 3})
        submit(kubectl, namespace, "too-big", **{"spec.distributed.numNodes": 1, "spec.distributed.gpusPerNode": 16,
                                                 "spec.runPolicy.capacityShortage": "create"})
        submit(kubectl, namespace, "gpu-run", **{"spec.distributed.gpusPerNode": 4, "spec.training.precision": "bf16"})
        submit(kubectl, namespace, "deadline", **{"spec.runPolicy.activeDeadlineSeconds": 8})
        running(kubectl, namespace, "steady", operator)
        pods = running(kubectl, namespace, "restarted", operator)
        terminate(kubectl, namespace, pods[0]["metadata"]["name"], 137, reason="OOMKilled")
        pods = running(kubectl, namespace, "restarted", operator, attempt=2)
        terminate(kubectl, namespace, pods[1]["metadata"]["name"], 1, reason="Error")
        running(kubectl, namespace, "restarted", operator, attempt=3)
        for pod in attempt_pods(kubectl, namespace, "gpu-run", 1):
            terminate(kubectl, namespace, pod["metadata"]["name"], 0, reason="Completed")
        wait_phase(kubectl, namespace, "gpu-run", "Succeeded", operator)
        wait_phase(kubectl, namespace, "deadline", "Failed", operator, reason="DeadlineExceeded")
        wait_status(kubectl, namespace, "too-big", lambda s: s.get("reason") == "Unschedulable", operator)
        time.sleep(4)  # the last states in a few scrapes
    assert not scraper.failures, scraper.failures
    assert len(scraper.scrapes) >= 15, len(scraper.scrapes)

    results = evaluate(build_components()["promql"] / "promql-eval", scraper.scrapes, panel_queries(dashboard),
                       step=1.0)
    (tmp_path / "results.json").write_text(json.dumps(results))  # to redraw without the cluster (draw())
    assert {q: r["error"] for q, r in results.items() if r.get("error")} == {}

    def last(query: str) -> dict[str, float]:
        """The query's value at the last scrape, by the series' label values."""
        return {",".join(s["metric"].values()): s["points"][-1][1] for s in results[query]["series"]}

    queries = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}
    phases = last(queries["FineTuneJobs by phase"][0])
    assert phases.get("Running", 0) >= 2 and phases.get("Pending", 0) >= 1, phases  # steady, restarted; too-big
    assert phases.get("Succeeded", 0) >= 1 and phases.get("Failed", 0) >= 1, phases  # gpu-run; deadline
    p50, p99 = (last(q)[""] for q in queries["Reconcile pass duration"])
    assert 0 < p50 <= p99 < 30, (p50, p99)
    restarts = last(queries["Gang restarts by reason"][0])
    assert restarts.get("OOMKilled", 0) >= 0.9 and sum(restarts.values()) >= 1.9, restarts  # increase() extrapolates
    assert last(queries["Pending jobs by why they wait"][0]).get("Unschedulable") == 1
    assert last(queries["GPU-hours (ended running periods)"][0])[""] > 0  # gpu-run: 8 GPUs for seconds
    assert last(queries["Restart downtime"][0])[""] > 0

    draw(dashboard, results, tmp_path / "dashboard.png", title_suffix=" (a test's five jobs, scraped every second)")
    assert (tmp_path / "dashboard.png").stat().st_size > 20_000
    if os.environ.get("FINETUNE_WRITE_DOCS_IMAGES") == "1":
        DOCS_IMAGE.write_bytes((tmp_path / "dashboard.png").read_bytes())


def answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False
