"""A stopped node leaves torch's c10d rendezvous (finetune_trainer.agent.leave): the survivors' next round forms
without waiting for its keep-alives to expire. Real rendezvous handlers on a real TCPStore, in threads."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from tests.support.controlplane import free_port

KEEP_ALIVE_SECONDS, MISSED = 1, 10  # the agent's: a silent node is taken for lost after 10 s


def handlers(port: int, count: int) -> list:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    made = []
    for i in range(count):
        params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="leave-test", min_nodes=2,
                                      max_nodes=3, is_host=i == 0, local_addr="127.0.0.1", join_timeout="60",
                                      last_call_timeout="1", keep_alive_interval=str(KEEP_ALIVE_SECONDS),
                                      keep_alive_max_attempt=str(MISSED))
        made.append(get_rendezvous_handler(params))
    return made


def rendezvous(nodes: list) -> tuple[list, float]:
    """Every node in `nodes` joins the next round at once; (each one's world size, seconds until the last one)."""
    sizes, started = [None] * len(nodes), time.monotonic()

    def join(i: int) -> None:
        sizes[i] = nodes[i].next_rendezvous().world_size

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return sizes, time.monotonic() - started


@pytest.mark.parametrize("leaves", [True, False])
def test_a_stopped_node_that_leaves_lets_the_survivors_re_form_at_once(leaves):
    from finetune_trainer.agent import leave

    nodes = handlers(free_port(), 3)
    try:
        sizes, _ = rendezvous(nodes)
        assert sizes == [3, 3, 3]
        stopped, survivors = nodes[2], nodes[:2]
        if leaves:
            assert leave(stopped)
        else:
            stopped._stop_heartbeats()  # torch's own stop: silent, still a participant of the round
        sizes, took = rendezvous(survivors)
        assert sizes == [2, 2]
        if leaves:
            assert took < KEEP_ALIVE_SECONDS * MISSED / 2, took
        else:  # the twin shows what leaving saves: the round waits for the silent node's keep-alives to expire
            assert took >= KEEP_ALIVE_SECONDS * (MISSED - 1), took
    finally:
        for node in nodes:
            node._stop_heartbeats()


def test_leaving_a_rendezvous_that_is_not_torchs_dynamic_one_says_no():
    from finetune_trainer.agent import leave

    assert leave(object()) is False


class Rounds:
    """A rendezvous handler's two calls torch's agent makes about membership, scripted: the nodes waiting to join,
    and the size of each next round (what a real c10d rendezvous decides; here a node that misses a round, which
    only a starved agent does, is scripted)."""

    def __init__(self, sizes: list[int], waiting: int = 1):
        self.sizes, self.waiting = list(sizes), waiting

    def num_nodes_waiting(self) -> int:
        return self.waiting

    def next_rendezvous(self):
        from types import SimpleNamespace

        return SimpleNamespace(world_size=self.sizes.pop(0))


def test_a_growth_whose_round_misses_the_waiting_node_is_tried_again_only_after_a_growing_pause(monkeypatch):
    """A node waits; the group stops to grow, but the round comes out at the old size (the waiting node missed it):
    the agent reads no waiting node for 30 s, then 60 s after a second miss; a growth that works resets the pause."""
    import finetune_trainer.agent as agent

    clock = [1000.0]
    monkeypatch.setattr(agent.time, "monotonic", lambda: clock[0])
    rounds = Rounds([2, 2, 2, 3, 2])
    throttle = agent.GrowthThrottle(rounds)
    assert rounds.next_rendezvous().world_size == 2  # the first round: two nodes, one more on its way
    assert rounds.num_nodes_waiting() == 1  # torch's agent restarts the group to grow
    assert rounds.next_rendezvous().world_size == 2  # ... and the waiting node missed the round
    assert throttle.pause == 30 and rounds.num_nodes_waiting() == 0
    clock[0] += 29
    assert rounds.num_nodes_waiting() == 0
    clock[0] += 2
    assert rounds.num_nodes_waiting() == 1
    assert rounds.next_rendezvous().world_size == 2  # missed again: twice as long
    assert throttle.pause == 60 and rounds.num_nodes_waiting() == 0
    clock[0] += 61
    assert rounds.num_nodes_waiting() == 1
    assert rounds.next_rendezvous().world_size == 3  # grown: the next growth is tried at once
    assert throttle.pause == 0
    rounds.waiting = 0
    assert rounds.next_rendezvous().world_size == 2  # a shrink (no growth was asked for) sets no pause
    assert throttle.pause == 0 and throttle.until < clock[0]


@pytest.mark.parametrize("longer_last_call", [True, False])
def test_a_waiting_node_slow_to_join_still_makes_the_growth_round(longer_last_call):
    """Two nodes train, a third waits to join; the two stop to grow. The third's agent is starved of CPU (each of
    next store sync comes 3 s late, after the usual last call): the growth's round waits for it (3 nodes).
    The twin with the usual last call shows the miss it prevents (the round closes on 2). Real c10d handlers."""
    import finetune_trainer.agent as agent

    nodes = handlers(free_port(), 3)
    try:
        sizes, _ = rendezvous(nodes[:2])
        assert sizes == [2, 2]
        for node in nodes[:2]:  # as run_elastic wraps the handler torch's launcher makes
            agent.GrowthThrottle(node, growth_last_call=30 if longer_last_call else 1)
        late = nodes[2]
        def wait_to_join():
            with contextlib.suppress(Exception):  # the twin's late node still waits when its store goes away
                late.next_rendezvous()

        waiting = threading.Thread(target=wait_to_join, daemon=True)
        waiting.start()
        deadline = time.monotonic() + 30
        while min(node.num_nodes_waiting() for node in nodes[:2]) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)  # each handler reads a state it caches for a second
        assert [node.num_nodes_waiting() for node in nodes[:2]] == [1, 1]
        sync, starved = late._state_holder.sync, [True]

        def starved_sync():  # the next time the late agent runs, 3 s from now
            if starved.pop() if starved else False:
                time.sleep(3)
            return sync()

        late._state_holder.sync = starved_sync
        sizes, took = rendezvous(nodes[:2])
        if longer_last_call:
            assert sizes == [3, 3] and took < 30, (sizes, took)
            assert nodes[0]._settings.timeout.last_call.total_seconds() == 1  # the usual one again after it
        else:
            assert sizes == [2, 2], sizes
    finally:
        for node in nodes:
            node._stop_heartbeats()


def test_leaving_a_store_that_does_not_answer_gives_up_at_the_timeout():
    """A store host gone without a reset: one store call blocks for the store's read timeout (minutes), past the
    pod's grace period; leaving gives up at its own timeout. A real handler whose store call never returns."""
    from finetune_trainer.agent import leave

    (node,) = handlers(free_port(), 1)
    released = threading.Event()
    node._op_executor.run = lambda *_: released.wait(60)  # the store call that does not come back
    try:
        started = time.monotonic()
        assert leave(node, timeout=1) is False
        assert time.monotonic() - started < 5
    finally:
        released.set()
        node._stop_heartbeats()


@pytest.mark.parametrize("handler_made", [False, True])
def test_a_stop_signal_out_of_the_launch_leaves_and_is_raised_again_with_the_registry_restored(handler_made, capsys):
    """run_elastic: torch's launcher makes its handler through the registry (recorded, its growths throttled); a
    stop signal out of the launch leaves the rendezvous, if one was made, and propagates; the registry is torch's
    own again afterwards."""
    import signal

    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.elastic.multiprocessing import SignalException

    from finetune_trainer.agent import GrowthThrottle, run_elastic

    original, made = registry.get_rendezvous_handler, []

    def launch():
        if handler_made:
            (node,) = handlers(free_port(), 1)
            made.append(node)
        raise SignalException("stopped", signal.SIGTERM)

    with pytest.raises(SignalException):
        run_elastic(launch)
    assert registry.get_rendezvous_handler is original
    if handler_made:
        assert isinstance(made[0].num_nodes_waiting.__self__, GrowthThrottle)
        assert "left the rendezvous" in capsys.readouterr().err
        made[0]._stop_heartbeats()
