"""A stopped node leaves torch's c10d rendezvous (finetune_trainer.agent.leave): the survivors' next round forms
without waiting for its keep-alives to expire. Real rendezvous handlers on a real TCPStore, in threads."""

from __future__ import annotations

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
