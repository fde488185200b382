"""The test kubelet's dump of a silent pod: a trainer pod that writes nothing for SILENT_SECONDS gets its agent's
threads printed into its own log (faulthandler on SIGUSR1), so a stall on a loaded machine says where it was."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.support import pod_runner
from tests.support.polling import wait_until

# Stands in for finetune_trainer.agent: the same argv marker and the same handler; it only sleeps, as a stalled
# agent does.
AGENT = ("import faulthandler, signal, sys, time; faulthandler.register(signal.SIGUSR1, all_threads=True); "
         "print('ready', flush=True); time.sleep(120)")


def test_a_silent_pod_gets_its_agent_threads_dumped_into_its_log_and_not_for_ever(tmp_path):
    runner = pod_runner.PodRunner(kubectl=None, control_plane=None, namespace="ns", workdir=tmp_path)
    log = tmp_path / "pods" / "job-a1-0" / "log"
    log.parent.mkdir(parents=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", AGENT, "finetune_trainer.agent"], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    pod = pod_runner.LocalProcess(proc)
    try:
        wait_until("the stand-in agent ready", lambda: "ready" in log.read_text(), timeout=60)
        runner._dump_if_silent("job-a1-0", pod)
        assert "most recent call first" not in log.read_text(), "dumped a pod that has just written"
        for _ in range(pod_runner.MOST_DUMPS + 2):
            past = time.time() - pod_runner.SILENT_SECONDS - 1
            os.utime(log, (past, past))
            runner._dump_if_silent("job-a1-0", pod)
            wait_until("the dump in the pod's log", lambda: log.read_text().count("most recent call first")
                       >= runner.dumps["job-a1-0"], timeout=60)
        text = log.read_text()
        assert text.count("test kubelet: job-a1-0 silent for") == pod_runner.MOST_DUMPS
        assert f"SIGUSR1 to [{proc.pid}]" in text  # the agent only: the launcher has no handler (SIGUSR1 ends it)
        assert "time.sleep" in text or "<string>" in text  # where the stalled thread was
        assert proc.poll() is None  # a dump does not end the pod
    finally:
        pod.kill()
