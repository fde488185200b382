"""A node that waits in torch's redundancy list when its group ends (finetune_trainer.agent: the end of a group it
waited for). Two real pods (finetune_trainer.launch over the agent over torch's elastic launch) of a 1-node job on a
real c10d rendezvous whose store node "a" hosts, as node 0's agent does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.support.controlplane import free_port
from tests.support.redundant_agent import FAILED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("group", ["succeeded", "failed"])
def test_a_node_waiting_for_a_place_when_the_group_ends_exits_as_the_group_did(tmp_path, group):
    """A node that finds the round full (a replacement pod whose lost predecessor's keep-alives have not expired
    yet, or one more node than max) waits in torch's redundancy list. When the group ends, the agent that ends it
    closes the rendezvous and torch tells the waiting node to exit gracefully, with no result from its agent. Its
    pod must end as the group did: 0 after a success (a Failed pod there is a lost node to the operator, counted
    against inPlaceRestarts while node 0 finishes), not 0 after a failure (its index would count as done, and a
    group formed again in place would wait for it); never having trained."""
    from torch.distributed import TCPStore

    script = ROOT / "tests" / "support" / "redundant_agent.py"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image"), os.environ.get("PYTHONPATH", "")])}
    logs = {name: (tmp_path / f"{name}.log").open("w+") for name in ("a", "b")}
    pods: dict[str, subprocess.Popen] = {}

    def start(name: str) -> None:
        pods[name] = subprocess.Popen([sys.executable, str(script), str(port), str(tmp_path), name], env=env,
                                      stdout=logs[name], stderr=subprocess.STDOUT, start_new_session=True)

    try:
        start("a")
        wait_for(lambda: (tmp_path / "a.started").exists(), 120, "node a's worker to start", pods, tmp_path)
        store = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
        start("b")
        wait_for(lambda: redundant_nodes(store) == 1, 120, "node b to wait in the redundancy list", pods, tmp_path)
        if group == "failed":
            (tmp_path / "fail").touch()
        (tmp_path / "release").touch()
        codes = {name: pod.wait(timeout=120) for name, pod in pods.items()}
        log = "".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))
        ended = json.loads((tmp_path / "b.termination.json").read_text())
        assert not (tmp_path / "b.started").exists()  # b never trained
        assert "did not train" in ended["message"], ended
        if group == "succeeded":
            assert codes == {"a": 0, "b": 0}, log
            assert ended["exitCode"] == 0, ended
        else:
            assert codes["a"] == FAILED and codes["b"] not in (0, FAILED), log
            assert ended["exitCode"] == codes["b"] and "failed" in ended["message"], ended
    finally:
        (tmp_path / "release").touch()  # a worker left behind ends at once
        for pod in pods.values():
            if pod.poll() is None:
                os.killpg(pod.pid, signal.SIGKILL)  # the launcher, its agent and the agent's worker
                pod.wait(timeout=30)
        for f in logs.values():
            f.close()


def redundant_nodes(store) -> int:
    """How many nodes wait in the redundancy list of the rendezvous "redundant", read from its store."""
    import pickle

    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    state = C10dRendezvousBackend(store, "redundant").get_state()
    return len(pickle.loads(state[0]).redundancy_list) if state else 0  # noqa: S301 - torch's own state


def wait_for(condition, seconds: float, what: str, procs: dict, folder) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        ended = {name: proc.poll() for name, proc in procs.items() if proc.poll() is not None}
        if ended or time.monotonic() > deadline:
            logs = "".join(p.read_text()[-2000:] for p in sorted(folder.glob("*.log")))
            raise AssertionError(f"waiting for {what}: ended {ended}\n{logs}")
        time.sleep(0.1)


@pytest.mark.parametrize("ends", ["returns", "raises", "stopped"])
def test_the_launch_ends_with_torchs_own_agent_run_and_registry(ends):
    """run_elastic patches torch's SimpleElasticAgent.run (a class attribute, under torch's @prof) and its handler
    registry for the launch alone: both are torch's own again however the launch ends."""
    import signal

    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing import SignalException

    from finetune_trainer.agent import run_elastic

    run, create, seen = SimpleElasticAgent.run, registry.get_rendezvous_handler, []

    def launch() -> None:
        seen.append(SimpleElasticAgent.run is not run)
        if ends == "raises":
            raise ValueError("the launch failed")
        if ends == "stopped":
            raise SignalException("stopped", signal.SIGTERM)

    if ends == "returns":
        assert run_elastic(launch) == 0
    else:
        with pytest.raises((ValueError, SignalException)):
            run_elastic(launch)
    assert seen == [True]
    assert SimpleElasticAgent.run is run and registry.get_rendezvous_handler is create


def test_a_group_end_on_a_store_that_does_not_answer_gives_up_at_its_timeouts(monkeypatch, capsys):
    """A store host gone without a reset: one store call blocks for the store's read timeout (minutes). Recording
    the end, reading it and waiting for the waiting nodes each give up at their own bound: a node that waited then
    cannot tell, and fails. A real handler whose store calls never return."""
    import threading

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from finetune_trainer.group_end import GroupEnd

    monkeypatch.setattr(GroupEnd, "CALL_SECONDS", 0.5)
    monkeypatch.setattr(GroupEnd, "READ_SECONDS", 0.5)
    node = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="silent", min_nodes=1, max_nodes=1, is_host=True,
        local_addr="127.0.0.1"))
    released = threading.Event()
    end = GroupEnd(node)
    end._store = type("Silent", (), {"add": lambda *_: released.wait(60)})()  # the store call that does not come back
    try:
        started = time.monotonic()
        end.record(failed=False)
        assert end.succeeded() is None
        end.after_close(waited=True)
        end.after_close(waited=False)
        assert time.monotonic() - started < 5
        assert "could not record the group's end" in capsys.readouterr().err
    finally:
        released.set()
        node._stop_heartbeats()
