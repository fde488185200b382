"""benchmarks/scale.py at a small size, so the benchmark cannot rot, and the request-budget properties it measures
hold on every change: they are counts, not timings (the figures themselves live in docs/results.md)."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_scale_benchmark_small_run_keeps_the_request_budget(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--jobs", "20", "--nodes", "10",
                           "--steady-seconds", "10", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    print("\n" + proc.stdout)
    assert figures["jobs"] == 20 and figures["pods"] == 80
    assert figures["creation_writes_per_job"] <= 6  # status, ConfigMap, Service, Job, Event
    assert figures["steady_requests_per_minute"] == 0  # watches only: nothing polls while nothing changes
    # No per-pass lists (caches): pods and a Job's events are read only by a look at a gang still waiting 10 s after
    # its Job was created (then every 15 s), each look one list of each.
    asked = figures["requests_until_running"]
    assert asked.get("list pods", 0) == asked.get("list events", 0) <= 4 * figures["jobs"], asked
