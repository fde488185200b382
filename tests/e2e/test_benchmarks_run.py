"""The benchmarks keep working: each runs end to end at a tiny size (their figures live in docs/results.md)."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_tokenization_benchmark_runs_and_reports_every_method(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tokenization.py"), "--rows", "300",
                           "--text-mb", "1", "--workers", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    for kind in ("chat", "text"):
        assert set(figures[kind]) == {"ours", "run_clm", "trl"}
        assert all(r["rowsPerSecond"] > 0 and r["peakRssMiB"] > 0 for r in figures[kind].values())
    assert figures["chat"]["ours"]["rows"] == 300


def test_object_storage_benchmark_runs_and_reports_both_figures(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "object_storage.py"), "--tiny", "--steps", "8",
                           "--save-steps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["checkpointBytes"] > 0 and figures["restartRatio"] > 0
    assert figures["restartToFirstStepSecondsFromBucket"] > 0 and figures["restartToFirstStepSecondsFromClaim"] > 0
