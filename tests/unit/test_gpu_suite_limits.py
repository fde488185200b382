"""The GPU suite's case limit: a case past it is killed with everything it started (its `finetune run`, TRL's run),
not only its own process, so nothing is left holding the device under the next case's figures. In smoke mode (on
a CPU that other work may keep busy) a case runs as long as it makes progress."""

import os
import signal
import subprocess
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

    monkeypatch.setattr(gpu_suite, "SMOKE_SECONDS", 10)  # in smoke mode: stopped once silent for 20 s
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


def writer(tmp_path: Path, every: float, times: int) -> subprocess.Popen:
    """A stand-in for a case: writes a line into the work directory every `every` seconds, `times` times."""
    script = (f"import time\nfor i in range({times}):\n    open({str(tmp_path / 'case.log')!r}, 'a').write('.')\n"
              f"    time.sleep({every})")
    return subprocess.Popen([sys.executable, "-c", script])


def test_a_smoke_case_that_keeps_writing_runs_past_its_stall_limit_and_a_silent_one_is_stopped(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_suite

    started = time.monotonic()
    assert gpu_suite.wait_for_case(writer(tmp_path, 0.5, 16), tmp_path, limit=60, stall=3) is None
    assert time.monotonic() - started > 6  # twice the stall limit, and not stopped
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        why = gpu_suite.wait_for_case(silent, tmp_path, limit=60, stall=3)
        assert why is not None and "changed for 3 s" in why and time.monotonic() - started < 30
    finally:
        silent.kill()
        silent.wait()
    busy = writer(tmp_path, 0.5, 120)  # progressing, but past the limit in all
    try:
        assert gpu_suite.wait_for_case(busy, tmp_path, limit=4, stall=3) == "timed out after 4 s"
    finally:
        busy.kill()
        busy.wait()
