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


def test_checkpoint_stall_benchmark_runs_and_reports_both_saves(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "checkpoint_stall.py"), "--layers", "2",
                           "--hidden", "64", "--vocab", "1000", "--saves", "2", "--methods", "lora", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lora = json.loads(out.read_text())["lora"]
    for mode in ("synchronous", "overlapped"):  # every save marked complete with its stall, never past its save
        assert len(lora[mode]["stalls"]) == 2 and all(0 <= s <= t for s, t in zip(lora[mode]["stalls"],
                                                                                  lora[mode]["saves"], strict=True))
    assert lora["ratio"] > 0


def test_elastic_recovery_benchmark_runs_a_shrink_on_a_deleted_pod(tmp_path):
    """The benchmark's graceful loss (a preemption or an eviction): every rank stops at one step with a checkpoint,
    the deleted pod's agent leaves the rendezvous, the survivors go on, on 2 nodes, in the same attempt."""
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "elastic_recovery.py"), "--only",
                           "elastic-deleted", "--kill-after", "10", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())["elastic-deleted"]
    assert (r["nodes"], r["attempt"], r["leftRendezvous"]) == (2, 1, True) and r["seconds"] > 0, r
    assert r["stepsRedone"] == 0 and r["phases"]["checkpoint load"] >= 0, r  # the stop saved the step it stopped at
