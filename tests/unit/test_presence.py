"""A member killed outright is left out of the next round at once, a member starved of CPU is not
(finetune_trainer.presence). Three real nodes on a real c10d rendezvous whose keep-alive window is a minute: a
re-formed round without the killed one well inside that minute was its presence port's doing, not the window's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.support.controlplane import free_port
from tests.support.polling import NotWithin, wait_until
from tests.support.presence_node import KEEP_ALIVE_MISSED, KEEP_ALIVE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
WINDOW = KEEP_ALIVE_SECONDS * KEEP_ALIVE_MISSED


@pytest.mark.parametrize("path", ["open", "rejected"])
def test_a_killed_member_is_swept_at_once_and_a_stopped_one_is_not(tmp_path, path):
    """open: c's port reachable; a stopped c is kept, a killed c swept at once. rejected: every knock on c's port
    is refused (a firewall that rejects it), so the refusal proves nothing and a stopped c is kept all the same."""
    from finetune_trainer.presence import knock

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer_image"), os.environ.get("PYTHONPATH", "")])}
    nodes: dict[str, subprocess.Popen] = {}
    logs = {name: (tmp_path / f"{name}.log").open("w+") for name in "abc"}

    def log() -> str:
        return "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))

    def rounds(n: int) -> dict[str, dict]:
        files = {name: tmp_path / f"{name}.round-{n}.json" for name in "abc"}
        return {name: json.loads(f.read_text()) for name, f in files.items() if f.exists()}

    def within(what: str, predicate, timeout: float) -> None:
        try:
            wait_until(what, predicate, timeout=timeout, every=0.2)
        except NotWithin as exc:
            raise AssertionError(f"{exc}\n{log()}") from None

    def sweeps(name: str) -> int:
        text = (tmp_path / f"{name}.sweeps").read_text() if (tmp_path / f"{name}.sweeps").exists() else ""
        return int(text) if text.isdigit() else 0

    try:
        for name in "abc":
            nodes[name] = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "presence_node.py"),
                                            str(port), str(tmp_path), name,
                                            *(["--rejected"] if path == "rejected" and name == "c" else [])],
                                           env=env, stdout=logs[name],
                                           stderr=subprocess.STDOUT, start_new_session=True)
        within("three nodes in round 1", lambda: len(rounds(1)) == 3, timeout=180)
        assert {r["world"] for r in rounds(1).values()} == {3}

        # Starved: c's process stopped. Its port still answers (the kernel), so a and b, joining the next round,
        # knock on it and leave it in: they wait for it (or for its keep-alives, a minute).
        published = store(port).get("finetune.presence.presence." + member(port, nodes["c"].pid)).split()
        c_port = int(published[0])
        os.kill(nodes["c"].pid, signal.SIGSTOP)
        before = {name: sweeps(name) for name in "ab"}
        (tmp_path / "again").touch()
        within("a and b knocking on the stopped c", lambda: all(sweeps(n) >= before[n] + 6 for n in "ab"),
               timeout=120)
        assert knock("127.0.0.1", c_port) is (path == "open")
        assert rounds(2) == {}, log()
        assert member(port, nodes["c"].pid) in participants(port), log()
        if path == "rejected":
            return

        # Killed: its port refuses, and the next sweep leaves it out; a and b form round 2 on two nodes.
        killed = time.monotonic()
        os.kill(nodes["c"].pid, signal.SIGKILL)
        within("a and b in round 2 without c", lambda: len(rounds(2)) == 2, timeout=WINDOW - 15)
        assert time.monotonic() - killed < WINDOW - 15
        assert {r["world"] for r in rounds(2).values()} == {2} and {r["rank"] for r in rounds(2).values()} == {0, 1}
        assert "gone (its agent's port refused a connection)" in log()
        assert knock("127.0.0.1", c_port) is False
    finally:
        for node in nodes.values():
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait(timeout=30)
        for f in logs.values():
            f.close()


def test_a_knock_tells_refused_from_unanswered():
    from finetune_trainer.presence import knock

    port = free_port()  # nothing listens there now
    assert knock("127.0.0.1", port) is False
    assert knock("no-such-node.invalid", port) is None  # a name that does not resolve proves nothing


def store(port: int):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))


def _state(port: int):
    import pickle

    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    state = C10dRendezvousBackend(store(port), "presence").get_state()
    return pickle.loads(state[0])  # noqa: S301 - torch's own state, in the store this test's nodes share


def participants(port: int) -> set[str]:
    return {repr(node) for node in _state(port).participants}


def member(port: int, pid: int) -> str:
    """The node descriptor (repr) of the member that process `pid` is."""
    state = _state(port)
    found = [repr(node) for node in [*state.participants, *state.wait_list] if node.pid == pid]
    if not found:
        raise LookupError(f"no member is process {pid}: {state.participants}")
    return found[0]


# --- one sweep, in this process: a real c10d handler hosting its store, and a member that is not this node -------

@pytest.fixture
def sweeping():
    """(presence, member, state): this process's Presence on a real c10d rendezvous (torch's handler, its store
    hosted here, 2 s x 5 keep-alives as the agent's), a member "X" of the round whose keep-alive is late (5 s old)
    and whose port has answered this agent once and is now closed (its agent gone), and `state(change=None)` that
    reads the rendezvous's state, or writes `change` to it first, as another node would."""
    from datetime import UTC, datetime

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _BackendRendezvousStateHolder, _NodeDesc
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from finetune_trainer.presence import Presence

    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="sweep", min_nodes=1, max_nodes=3,
        local_addr="127.0.0.1", is_host=True, keep_alive_interval=2, keep_alive_max_attempt=5))
    presence = Presence(handler)
    other = _BackendRendezvousStateHolder(handler._state_holder._backend, handler._settings, cache_duration=0)

    def state(change=None):
        for _ in range(5):
            other.sync()
            if change is None:
                return other.state
            change(other.state)
            other.mark_dirty()
            if other.sync():
                return other.state
        raise AssertionError("could not write the rendezvous state")

    member = _NodeDesc("127.0.0.1", 1 << 22, 0)  # above any pid of this machine: no agent of ours

    def join(s):
        s.participants[member] = 0
        s.last_heartbeats[member] = datetime.now(UTC) - timedelta(seconds=5)

    state(join)
    with socket.create_server(("127.0.0.1", 0)) as port:
        handler._store.set(presence._key(member), str(port.getsockname()[1]))
        assert presence.sweep() == [] and repr(member) in presence.answered  # late, knocked: it answers
    yield presence, member, state
    handler.shutdown()


def test_a_late_member_whose_port_is_closed_is_swept(sweeping):
    presence, member, state = sweeping
    assert presence.sweep() == [repr(member)]
    assert member not in state().participants  # torch's sanitizer took it out at the next read


def test_a_round_joined_while_a_sweep_is_stuck_starts_its_workers_without_the_knock(sweeping, monkeypatch):
    """A sweep stuck in a store call (node 0 starved, a store that does not answer) holds the presence's state: the
    join that ends meanwhile goes on to fork its workers; its knock of the new round is skipped, not waited for."""
    import threading

    presence, member, _ = sweeping
    monkeypatch.setattr(presence, "_next", lambda: "joined")
    stuck, release = threading.Event(), threading.Event()

    def stuck_sweep():
        with presence._lock:
            stuck.set()
            release.wait(300)

    threading.Thread(target=stuck_sweep, daemon=True).start()
    assert stuck.wait(30)
    returned = []
    joining = threading.Thread(target=lambda: returned.append(presence.next_rendezvous()), daemon=True)
    joining.start()
    joining.join(60)  # the sweeper is given 3 s to end; the join must not wait for the stuck sweep beyond that
    release.set()
    assert returned == ["joined"], "the join waited for a sweep stuck in a store call"


def test_a_sweeper_that_waited_for_a_stuck_sweep_does_not_sweep_after_the_round_formed(sweeping, monkeypatch):
    """The sweeper of this join waits for the state held by a stuck sweep (one left over from an earlier join); the
    round forms meanwhile and torch forks the workers. When the stuck sweep lets go, that sweeper must end, not
    begin a sweep (store calls, lookups, connects) in the window where the workers are forked."""
    import threading

    presence, member, state = sweeping

    class Watched:  # the presence's lock, saying when the sweeper asks for it
        def __init__(self):
            self.inner, self.wanted = threading.Lock(), threading.Event()

        def acquire(self, blocking=True, timeout=-1):
            if threading.current_thread().name == "finetune-presence-sweep":
                self.wanted.set()
            return self.inner.acquire(blocking, timeout)

        def release(self):
            self.inner.release()

        def __enter__(self):
            self.acquire()

        def __exit__(self, *_):
            self.release()

    lock = Watched()
    monkeypatch.setattr(presence, "_lock", lock)
    stuck, release = threading.Event(), threading.Event()

    def stuck_sweep():
        with lock:
            stuck.set()
            release.wait(300)

    threading.Thread(target=stuck_sweep, daemon=True).start()
    assert stuck.wait(30)
    monkeypatch.setattr(presence, "_next", lambda: lock.wanted.wait(60) and "joined")  # formed once it waits
    before = presence.sweeps
    assert presence.next_rendezvous() == "joined"
    (sweeper,) = [t for t in threading.enumerate() if t.name == "finetune-presence-sweep"]
    release.set()
    sweeper.join(60)
    assert not sweeper.is_alive()
    assert presence.sweeps == before, "the sweeper swept after the round formed"
    assert member in state().participants


def test_a_keep_alive_written_after_the_knock_keeps_its_member(sweeping, monkeypatch):
    """The member's keep-alive lands between this agent's read of the state and its write (the compare-and-set
    then fails): that keep-alive is newer than the knock, so the member stays, whatever the knock said."""
    from datetime import UTC, datetime

    presence, member, state = sweeping
    knocked = presence._gone

    def knocked_then_kept_alive(suspects):
        gone = knocked(suspects)
        state(lambda s: s.last_heartbeats.__setitem__(member, datetime.now(UTC)))
        return gone

    monkeypatch.setattr(presence, "_gone", knocked_then_kept_alive)
    assert presence.sweep() == []
    assert member in state().participants and state().last_heartbeats[member] > datetime.now(UTC) - timedelta(
        seconds=5)


@pytest.mark.parametrize("order", ["unanswered first", "refused first"])
def test_a_name_refused_at_one_address_and_unanswered_at_another_proves_nothing(monkeypatch, order):
    """A name with two addresses (a dual-stack pod, a stale record beside the live one): one refuses, the other
    gives no answer in time (its accept queue full, as a host that drops the connection). The refusal says nothing
    of the other address: nothing is known, whichever was tried last. Both refusing: gone; one accepting: there.
    The name's resolution is this test's (no DNS here to give one name two addresses); the connections are real."""
    from finetune_trainer.presence import knock

    with socket.create_server(("127.0.0.1", 0), backlog=0) as full, socket.create_server(("127.0.0.1", 0)) as open_:
        held = socket.create_connection(full.getsockname())  # the one place in its queue
        refused, unanswered, accepted = free_port(), full.getsockname()[1], open_.getsockname()[1]
        assert knock("127.0.0.1", unanswered, timeout=0.5) is None and knock("127.0.0.1", refused) is False
        resolved = {}
        monkeypatch.setattr(socket, "getaddrinfo", lambda *_a, **_k: [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)) for port in resolved["ports"]])
        resolved["ports"] = [unanswered, refused] if order == "unanswered first" else [refused, unanswered]
        assert knock("two-addresses.test", 1, timeout=0.5) is None
        resolved["ports"] = [refused, refused]
        assert knock("two-addresses.test", 1, timeout=0.5) is False
        resolved["ports"] = [refused, accepted]
        assert knock("two-addresses.test", 1, timeout=0.5) is True
        held.close()


def test_a_name_that_cannot_be_looked_up_proves_nothing():
    from finetune_trainer.presence import knock

    assert knock("x" * 64 + ".invalid", free_port()) is None  # a label past DNS's 63 characters: not even asked


def test_a_sweep_reads_every_members_port_in_two_store_requests(sweeping):
    """Node 0's store serves every agent's sweeps and, after each round, each agent's knock on every new member:
    with one request per member, hundreds of nodes made hundreds of thousands of requests as their workers started.
    Two per sweep here (are they all published, then all of them at once), however many members are late."""
    from datetime import UTC, datetime

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    presence, gone, state = sweeping
    store = presence._handler._store
    members = [_NodeDesc("127.0.0.1", (1 << 22) + n, 0) for n in range(1, 21)]

    def join(s):
        for node in members:
            s.participants[node] = 0
            s.last_heartbeats[node] = datetime.now(UTC) - timedelta(seconds=5)

    state(join)
    with socket.create_server(("127.0.0.1", 0)) as port:
        for node in members:
            store.set(presence._key(node), str(port.getsockname()[1]))
        requests: list[str] = []

        class Counted:  # the handler's own store, each request counted
            def __getattr__(self, name):
                requests.append(name)
                return getattr(store, name)

        presence._handler._store = Counted()
        try:
            assert presence.sweep() == [repr(gone)] and {repr(node) for node in members} <= presence.answered
        finally:
            presence._handler._store = store
    assert len(requests) <= 2, requests


def test_a_member_that_published_no_port_is_left_to_its_keep_alives(sweeping):
    """Its presence failed to listen (or it runs without it): nothing to knock, and the others are still swept."""
    from datetime import UTC, datetime

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    presence, gone, state = sweeping
    silent = _NodeDesc("127.0.0.1", (1 << 22) + 100, 0)
    state(lambda s: (s.participants.__setitem__(silent, 0),
                     s.last_heartbeats.__setitem__(silent, datetime.now(UTC) - timedelta(seconds=5))))
    assert presence.sweep() == [repr(gone)]
    assert repr(silent) not in presence.answered and silent in state().participants


def test_a_member_is_knocked_at_the_address_it_published_without_a_lookup_of_its_name(sweeping, monkeypatch):
    """Each agent publishes its address on the route to node 0's store beside its port: a knock needs no DNS query
    (one per member and agent would load the cluster's DNS at hundreds of nodes). This node published its own."""
    from datetime import UTC, datetime

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    presence, gone, state = sweeping
    own = presence._handler._store.get(presence._key(presence._handler._this_node)).decode()
    assert own.split(" ")[1] == "127.0.0.1"  # its store is on 127.0.0.1 here
    named = _NodeDesc("no-such-node.invalid", (1 << 22) + 200, 0)  # a name no lookup could find
    state(lambda s: (s.participants.__setitem__(named, 0),
                     s.last_heartbeats.__setitem__(named, datetime.now(UTC) - timedelta(seconds=5))))
    lookups: list[str] = []
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: lookups.append(host) or real(host, *a, **k))
    with socket.create_server(("127.0.0.1", 0)) as port:
        presence._handler._store.set(presence._key(named), f"{port.getsockname()[1]} 127.0.0.1")
        presence.sweep()
        assert repr(named) in presence.answered and "no-such-node.invalid" not in lookups


def test_a_loopback_address_is_not_taken_from_a_member_when_this_node_has_another():
    """A node 0 that reached its own store through 127.0.0.1 would publish it: another node knocking there would
    knock on itself. Its name is knocked instead, unless this node's own address is a loopback one too (one host)."""
    from types import SimpleNamespace

    from finetune_trainer.presence import Presence

    node = SimpleNamespace(addr="job-a1-0.job.ns.svc")
    here = Presence.__new__(Presence)
    here._address = "10.0.0.7"
    assert here._where(node, b"4000 127.0.0.1") == ("job-a1-0.job.ns.svc", 4000)
    assert here._where(node, b"4000 10.0.0.5") == ("10.0.0.5", 4000)
    assert here._where(node, b"4000") == ("job-a1-0.job.ns.svc", 4000)  # an agent that published no address
    here._address = "127.0.0.1"
    assert here._where(node, b"4000 127.0.0.1") == ("127.0.0.1", 4000)
