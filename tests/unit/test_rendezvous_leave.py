"""A stopped node leaves torch's c10d rendezvous (finetune_trainer.agent.leave): the survivors' next round forms
without waiting for its keep-alives to expire. Real rendezvous handlers on a real TCPStore, in threads."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from tests.support.controlplane import free_port

KEEP_ALIVE_SECONDS, MISSED = 1, 10  # the agent's: a silent node is taken for lost after 10 s


def handlers(port: int, count: int, last_call: int = 1) -> list:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    made = []
    for i in range(count):
        params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="leave-test", min_nodes=2,
                                      max_nodes=3, is_host=i == 0, local_addr="127.0.0.1", join_timeout="60",
                                      last_call_timeout=str(last_call), keep_alive_interval=str(KEEP_ALIVE_SECONDS),
                                      keep_alive_max_attempt=str(MISSED))
        made.append(get_rendezvous_handler(params))
    return made


def stop_all(nodes: list) -> None:
    """Stops every handler's keep-alives; a join still finishing in its thread may be between creating its timer
    and starting it (torch then says "cannot join thread before it is started")."""
    for node in nodes:
        with contextlib.suppress(RuntimeError):
            node._stop_heartbeats()


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
        stop_all(nodes)


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
        stop_all(nodes)


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


def join_in_thread(node, sizes: dict, key) -> threading.Thread:
    def join() -> None:
        with contextlib.suppress(Exception):  # a node left out waits until its store goes away
            sizes[key] = node.next_rendezvous().world_size

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    return thread


def wait_until(check, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def test_a_growth_round_whose_fewest_nodes_the_joining_node_completes_still_waits_for_a_slow_survivor():
    """The round's deadline is set by whichever node brings it to min_nodes, with its own last call. Here the
    joining node is that one, and the second survivor, in the wait list after its exit, is starved for 3 s: the
    growth's round must still wait for it (3 nodes). Every handler wrapped as run_elastic wraps it."""
    import finetune_trainer.agent as agent

    nodes = handlers(free_port(), 3)
    try:
        for node in nodes:
            agent.GrowthThrottle(node, growth_last_call=30)
        sizes: dict = {}
        for t in [join_in_thread(node, sizes, i) for i, node in enumerate(nodes[:2])]:
            t.join(timeout=60)
        assert sizes == {0: 2, 1: 2}
        join_in_thread(nodes[2], sizes, 2)  # waits to join the group under way
        assert wait_until(lambda: nodes[1].num_nodes_waiting() == 1)
        sizes.clear()
        join_in_thread(nodes[0], sizes, 0)  # survivor 0 stops first: out of the complete round, into the wait list
        assert wait_until(lambda: nodes[1].num_nodes_waiting() == 2)
        sync, starved = nodes[0]._state_holder.sync, [True]

        def starved_sync():
            if starved.pop() if starved else False:
                time.sleep(3)
            return sync()

        nodes[0]._state_holder.sync = starved_sync
        join_in_thread(nodes[1], sizes, 1).join(timeout=60)  # opens the next round; the joiner is its second
        assert sizes.get(1) == 3, sizes
    finally:
        stop_all(nodes)


def test_a_waiting_node_that_is_stopped_leaves_the_wait_list_at_once():
    """A pod waiting to join is deleted (SIGTERM: torch's SignalException out of its join): leave() takes it off
    the wait list too, or the group would read it as waiting until its keep-alives expire (10 s) and stop to grow
    for it."""
    import signal

    from torch.distributed.elastic.multiprocessing import SignalException

    from finetune_trainer.agent import leave

    nodes = handlers(free_port(), 3)
    try:
        sizes: dict = {}
        for t in [join_in_thread(node, sizes, i) for i, node in enumerate(nodes[:2])]:
            t.join(timeout=60)
        late = nodes[2]
        sync, stopped = late._state_holder.sync, threading.Event()

        def sync_until_stopped():  # the agent's SIGTERM arrives while it waits
            if stopped.is_set():
                raise SignalException("stopped", signal.SIGTERM)
            return sync()

        late._state_holder.sync = sync_until_stopped
        waiting = join_in_thread(late, sizes, 2)
        assert wait_until(lambda: nodes[0].num_nodes_waiting() == 1)
        stopped.set()
        waiting.join(timeout=10)
        late._state_holder.sync = sync
        assert leave(late)
        assert wait_until(lambda: nodes[0].num_nodes_waiting() == 0, seconds=3), "still on the wait list"
    finally:
        stop_all(nodes)


def test_a_group_that_re_forms_whole_after_a_worker_failure_sets_no_growth_pause(capsys):
    """A worker of node 0 fails: its agent restarts in place (exit, then the wait list of the complete round). The
    other nodes' agents, their workers still healthy, read one node waiting and restart for it; the group re-forms
    whole (3 nodes, its maximum). The node they read as waiting was one of the group, not a joiner: no growth was
    missed, so no pause (which would ignore a real joiner for 30 s, doubling) and no "missed the round" line. Real
    c10d handlers, each wrapped as run_elastic wraps it (a usual last call of 5 s: a loaded machine's round still
    takes all three, and one of maxNodes closes when they are in)."""
    import finetune_trainer.agent as agent

    nodes = handlers(free_port(), 3, last_call=5)
    try:
        throttles = [agent.GrowthThrottle(node, growth_last_call=30) for node in nodes]
        sizes: dict = {}
        for t in [join_in_thread(node, sizes, i) for i, node in enumerate(nodes)]:
            t.join(timeout=60)
        assert sizes == {0: 3, 1: 3, 2: 3}
        sizes.clear()
        restarted = join_in_thread(nodes[0], sizes, 0)  # node 0's worker failed: torch's agent re-rendezvouses
        assert wait_until(lambda: all(node.num_nodes_waiting() == 1 for node in nodes[1:]))  # as its monitor reads
        others = [join_in_thread(node, sizes, i) for i, node in enumerate(nodes) if i]
        for t in [restarted, *others]:
            t.join(timeout=60)
        assert sizes == {0: 3, 1: 3, 2: 3}, sizes
        assert [t.pause for t in throttles] == [0, 0, 0], [(t.pause, t.world) for t in throttles]
        assert "missed the round" not in capsys.readouterr().err
    finally:
        stop_all(nodes)


def test_a_shrink_after_a_silent_loss_keeps_the_usual_last_call():
    """Node 2 is lost without a word (its keep-alives stop); the survivors' workers fail and their agents restart
    one after the other. Survivor 0 exits first, into the wait list of the complete round (node 2 is still in it
    until its keep-alives lapse); survivor 1 then reads a node waiting, though it is no joiner, only its peer. Once
    node 2 is swept the two rejoin, and the round closes after the last call of whichever brings it to min_nodes:
    here survivor 1 (it acts late on the reopened round: the order is otherwise chance). A shrink must keep the
    usual last call (1 s here), not a growth's (10 s here, 30 s in a pod). Real c10d handlers, each wrapped as
    run_elastic wraps it."""
    import finetune_trainer.agent as agent

    nodes = handlers(free_port(), 3)
    try:
        for node in nodes:
            agent.GrowthThrottle(node, growth_last_call=10)
        sizes: dict = {}
        for t in [join_in_thread(node, sizes, i) for i, node in enumerate(nodes)]:
            t.join(timeout=60)
        assert sizes == {0: 3, 1: 3, 2: 3}
        nodes[2]._stop_heartbeats()  # lost: silent, still a participant until its keep-alives lapse (10 s)
        sizes.clear()
        started = time.monotonic()
        first = join_in_thread(nodes[0], sizes, 0)
        assert wait_until(lambda: nodes[1].num_nodes_waiting() == 1)
        second = join_in_thread(nodes[1], sizes, 1)
        assert wait_until(lambda: nodes[2].num_nodes_waiting() == 2)  # both survivors wait (read by the lost one)
        holder, late = nodes[1]._state_holder, [True]
        sync = holder.sync

        def late_sync():  # survivor 1 adds itself second: it acts 2 s late on the round node 2's sweep reopened
            synced = sync()
            if not holder.state.complete and late:
                late.pop()
                time.sleep(2)
            return synced

        holder.sync = late_sync
        for t in (first, second):
            t.join(timeout=60)
        took = time.monotonic() - started
        assert sizes == {0: 2, 1: 2}, sizes
        assert took < KEEP_ALIVE_SECONDS * MISSED + 7, took  # the sweep, the late sync, the usual last call
    finally:
        stop_all(nodes)

