"""Rank 0's Preparing heartbeat speaks for the other nodes' tokenizing processes only while they are heard from: a
real c10d TCPStore, and another process counting its beats in it that is frozen (SIGSTOP: every thread stops, as in
a hung process) and thawed."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from finetune_operator.api import constants as c
from finetune_trainer.data.peer_liveness import PeerWatch, watched_ranks
from finetune_trainer.data.preparing import PreparingHeartbeat
from tests.support.polling import wait_until

# Another node's first process (rank 1): beats every 0.1 s until told to finish, then marks itself done.
NODE = """
import sys, time
from pathlib import Path
from torch.distributed import TCPStore
from finetune_trainer.data.peer_liveness import NodeBeat
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False)
with NodeBeat(store, 1, interval=0.1):
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
"""
SILENT_AFTER = 5.0  # seconds: above most of a busy machine's pauses of a live process (one is tolerated)


def records(tmp_path) -> list[dict]:
    path = tmp_path / c.PROGRESS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_the_heartbeat_stops_while_a_tokenizing_node_is_frozen_and_goes_on_when_it_is_back_or_done(store, tmp_path):
    finish = tmp_path / "finish"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    node = subprocess.Popen([sys.executable, "-c", NODE, str(store.port), str(finish)], env=env)
    try:
        heartbeat = PreparingHeartbeat(tmp_path, None, interval=0.1, peers=PeerWatch(store, [1], SILENT_AFTER))
        with heartbeat:
            wait_until("the node beats", lambda: store.add("finetune/preparing/0/1/beats", 0) > 3, timeout=60)
            alive = len(records(tmp_path))
            wait_until("the heartbeat goes on while the node beats", lambda: len(records(tmp_path)) > alive + 5)
            os.kill(node.pid, signal.SIGSTOP)

            def held_back() -> int | None:
                """The record count once the heartbeat has been silent for ten intervals after saying why (a
                starved node may have been missed before the stop too: only the state after it counts)."""
                before = len(records(tmp_path))
                time.sleep(1.0)
                now = records(tmp_path)
                return len(now) if len(now) == before and "no sign of life" in now[-1]["message"] else None

            held = wait_until("the heartbeat held back, its last record saying why", held_back,
                              timeout=SILENT_AFTER + 60, every=0.1)
            said = records(tmp_path)[-1]["message"]
            assert "rank 1 (" in said and "runPolicy.stallTimeoutSeconds" in said, said
            os.kill(node.pid, signal.SIGCONT)
            wait_until("the heartbeat goes on once the node beats again", lambda: len(records(tmp_path)) > held + 3,
                       timeout=30)
            finish.touch()
            assert node.wait(timeout=60) == 0
            # Done, it beats no more, and is not missed: the heartbeat goes on past the silence limit.
            ended = time.monotonic()
            wait_until("past the silence limit", lambda: time.monotonic() - ended > SILENT_AFTER + 1, every=0.5)
            last = len(records(tmp_path))
            wait_until("the heartbeat goes on after the node is done", lambda: len(records(tmp_path)) > last + 3)
        assert all("rank 1 (" in r["message"] for r in records(tmp_path) if "no sign of life" in r["message"])
    finally:
        if node.poll() is None:
            os.kill(node.pid, signal.SIGCONT)
            node.kill()
            node.wait()


def test_a_node_never_heard_from_is_silent_from_the_watchs_start(store):
    now = [100.0]
    watch = PeerWatch(store, [2, 4], silent_after=300, clock=lambda: now[0])
    assert watch.silent() == {}
    now[0] += 300
    assert watch.silent() == {2: 300.0, 4: 300.0}
    store.add("finetune/preparing/0/4/beats", 1)
    assert watch.silent() == {2: 300.0}  # 4 beat: counted from now
    store.add("finetune/preparing/0/2/done", 1)
    now[0] += 1000
    assert watch.silent() == {4: 1000.0}  # 2 finished: not watched any more


def test_a_done_mark_of_an_earlier_worker_group_does_not_speak_for_this_one(store, monkeypatch):
    """torchrun's in-place restart keeps the rendezvous store: the previous group's marks stay in it."""
    store.add("finetune/preparing/0/1/done", 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    now = [0.0]
    watch = PeerWatch(store, [1], silent_after=10, clock=lambda: now[0])
    now[0] = 10
    assert watch.silent() == {1: 10.0}


@pytest.mark.parametrize("world,local,ranks", [(1, 1, []), (2, 1, [1]), (8, 4, [4]), (16, 4, [4, 8, 12]),
                                               (4, 4, []), (3, 1, [1, 2])])
def test_the_watched_ranks_are_every_other_nodes_first_process(world, local, ranks):
    assert watched_ranks(world, local) == ranks
