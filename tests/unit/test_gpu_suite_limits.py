"""The GPU suite's case limit: a case past it is killed with everything it started (its `finetune run`, TRL's run),
not only its own process, so nothing is left holding the device under the next case's figures."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def started_by(folder: Path, marker: str = "") -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(folder) in cmdline and marker in cmdline:
            found.append(proc)
    return found


def test_a_case_past_its_limit_is_killed_with_its_children(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_suite

    monkeypatch.setattr(gpu_suite, "SMOKE_SECONDS", 10)  # a 40 s limit in smoke mode
    results: list[dict] = []
    case = threading.Thread(target=lambda: results.append(gpu_suite.run_case("in_place_restart", tmp_path, True)))
    case.start()
    try:
        # The case's `finetune run`, held stopped once it is there: the case then waits on it past its limit.
        deadline = time.monotonic() + 40
        while not (runs := started_by(tmp_path, "finetune_operator run")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert runs, "the case never started its finetune run"
        for proc in runs:
            proc.send_signal(signal.SIGSTOP)
        case.join(timeout=120)
        assert results and results[0]["status"] == "failed" and "timed out" in results[0]["error"], results
        deadline = time.monotonic() + 30  # killed at once; reaped by their parents a moment later
        while started_by(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not started_by(tmp_path), [" ".join(p.cmdline()) for p in started_by(tmp_path)]
    finally:
        for proc in started_by(tmp_path):
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        case.join(timeout=60)
