"""The peer benchmark's harness keeps its figures whatever a controller does at the end: one that ignores SIGTERM
is killed after its grace instead of raising (which lost both sides' figures at 1,000 jobs)."""

import subprocess
import sys
import time

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_kubeflow


def test_a_controller_that_ignores_sigterm_is_killed_after_its_grace():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                                 "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "up"
    started = time.monotonic()
    said = peer_kubeflow.stop_process(stubborn, grace=1.0)
    assert stubborn.poll() is not None and time.monotonic() - started < 20
    assert said is not None and "did not exit within 1 s of SIGTERM: killed" in said


def test_a_controller_that_stops_says_nothing():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    assert peer_kubeflow.stop_process(quick, grace=10.0) is None and quick.poll() is not None


def test_each_sides_figures_are_saved_and_a_failure_is_in_them(tmp_path):
    out = tmp_path / "figures.json"
    peer_kubeflow.save(out, {peer_kubeflow.OURS: {"creation_jobs_per_s": 9.0},
                             peer_kubeflow.PEER: {"failed": "TimeoutError: every job Running"}})
    assert "TimeoutError" in out.read_text() and "creation_jobs_per_s" in out.read_text()
