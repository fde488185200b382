"""A node's presence, so that the survivors of a node killed outright re-form without it at once
(finetune_trainer.agent.run_elastic).

torch's c10d rendezvous leaves a member out of the next round only once its keep-alives lapse (keep_alive_interval x
keep_alive_max_attempt: 10 s here, since a shorter window swept live agents starved of CPU). A node that leaves with a
word (its pod deleted or evicted) leaves the rendezvous on its way out; a node killed outright (its container or its
processes, an OOM kill) says nothing, and the survivors waited out its 10 s.

A killed agent can be told from a starved one at once: each agent listens on a TCP port of its own (published in the
rendezvous's store). The kernel answers a connection to it whether or not the agent gets the CPU, and refuses it once
the agent's process is gone. While an agent joins a round, it knocks on the port of each member whose keep-alive is
late; a refused knock marks that member's keep-alive lapsed in the rendezvous's state, and torch's own sweep leaves it
out at the next read. A knock that gets no answer (a node whose network is gone, a policy that drops it) proves
nothing, even where another address of the same name refuses: that node's keep-alives lapse as before. Nor does a
refusal from a member whose port never answered this agent (a firewall that rejects the port refuses for a live node
too): each member is knocked once as a round forms.
"""

import concurrent.futures
import contextlib
import errno
import ipaddress
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from finetune_trainer.group_end import store_key

KNOCK_SECONDS = 1.0  # one connection attempt; a refusal comes back at once
EVERY_SECONDS = 1.0  # between sweeps while this agent joins a round (each takes the CPU the join needs too)
LAPSED = datetime(1970, 1, 1, tzinfo=UTC)  # a keep-alive older than any window: torch sweeps the node
MOST_KNOCKS = 32  # at once; a round of hundreds of nodes is knocked in batches


def knock(address: str, port: int, timeout: float = KNOCK_SECONDS) -> bool | None:
    """False when the port refuses a connection at every address of the name (nothing listens there: the agent is
    gone), True when it accepts at one, None when nothing is known (no answer in time or no route at one of them, a
    name that does not resolve)."""
    try:
        with socket.create_connection((address, port), timeout=timeout, all_errors=True):
            return True
    except ExceptionGroup as failed:  # one error per address tried
        return False if all(_refused(exc) for exc in failed.exceptions) else None
    except (OSError, UnicodeError):  # not resolved (UnicodeError: a name no DNS query can carry)
        return None


def own_address(store: Any) -> str | None:
    """This node's address on its route to the rendezvous's store (node 0's agent): where the other nodes reach it,
    published beside the port so that a knock needs no DNS lookup (one per member and agent would load the cluster's
    DNS at hundreds of nodes). None where it cannot be told (the knock then resolves the node's name)."""
    target = getattr(store, "underlying_store", store)
    host, port = getattr(target, "host", None), getattr(target, "port", None)
    if not host or not port:
        return None
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)  # a UDP connect sends nothing: it only picks the route
            return str(probe.getsockname()[0])
    except (OSError, UnicodeError):
        return None


def _loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED


class Presence:
    """This agent's listening port, published under its node's name, and the sweep of gone members while it joins
    a round (wrapping the handler's next_rendezvous). Nothing for a handler that is not torch's c10d one."""

    def __init__(self, handler: Any) -> None:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            _BackendRendezvousStateHolder,
        )

        self._handler = handler
        self.sweeps = 0  # sweeps made (each knocks the late members)
        self.answered: set[str] = set()  # members whose port accepted a knock from this agent (only these are swept)
        self._lock = threading.Lock()  # the sweeps and the knocks after a round share one state holder
        if not isinstance(handler, DynamicRendezvousHandler):
            return
        self._node = handler._this_node
        self._prefix = store_key(handler, "presence", "")
        self._window = handler._settings.keep_alive_interval
        # A state holder of its own: torch's is not thread-safe, and the join runs in the agent's main thread.
        self._holder = _BackendRendezvousStateHolder(handler._state_holder._backend, handler._settings,
                                                     cache_duration=0)
        try:
            self._server = self._listen()
            self._address = own_address(handler._store)
            published = f"{self._server.getsockname()[1]} {self._address or ''}".strip()
            handler._store.set(self._key(self._node), published)
        except Exception as exc:  # no port, the store, torch's private API changed: the keep-alives decide, as before
            print(f"finetune agent: no presence port ({exc!r}): a lost node is left out after its keep-alives lapse",
                  file=sys.stderr, flush=True)
            return
        self._next = handler.next_rendezvous
        handler.next_rendezvous = self.next_rendezvous

    def next_rendezvous(self) -> Any:
        joining = threading.Event()
        sweeper = threading.Thread(target=self._sweep_until, args=(joining,), daemon=True,
                                   name="finetune-presence-sweep")
        sweeper.start()
        try:
            joined = self._next()
        finally:
            # The sweeper ends after its current sweep (each knock in it is bounded) and starts none after this;
            # one stuck longer in a store call (node 0 starved) is left to end on its own, in its store call.
            joining.set()
            sweeper.join(timeout=3 * KNOCK_SECONDS)
        # Here, not in a thread: torch forks the workers next, and a thread of ours caught inside a lookup or a
        # connect would leave its locks held in every worker. A round of live members answers in milliseconds.
        self._knock_members()
        return joined

    def sweep(self) -> list[str]:
        """One sweep: the members whose keep-alive is late and whose port refuses a knock, marked lapsed in the
        rendezvous's state (their names)."""
        with self._lock:
            return self._sweep()

    def _sweep(self) -> list[str]:
        self._holder.sync()
        state = self._holder.state
        late = datetime.now(UTC) - self._window
        members = set(state.participants) | set(state.wait_list) | set(state.redundancy_list)
        suspects = [node for node in members if node != self._node and state.last_heartbeats.get(node, LAPSED) < late]
        gone = self._gone(suspects)
        self.sweeps += 1
        for _ in range(5):  # a write that lost a race with another node's is made again on the state it wrote
            state = self._holder.state
            # Only a member still late there: a keep-alive written since the knock proves its agent alive.
            marked = [node for node in gone if state.last_heartbeats.get(node, late) < late]
            if not marked:
                break
            for node in marked:
                state.last_heartbeats[node] = LAPSED
            self._holder.mark_dirty()
            if self._holder.sync():
                print(f"finetune agent: {', '.join(map(str, marked))} gone (its agent's port refused a connection): "
                      "left out of the rendezvous now, not after its keep-alives lapse", file=sys.stderr, flush=True)
                return [str(node) for node in marked]
        return []

    def _knock_members(self) -> None:
        """Each member of the round just formed, knocked once: its port reached from here (see answered). Skipped
        while a sweep still holds the state (its store call slow): the workers' start must not wait for it, and a
        member never knocked is only never swept (its keep-alives decide)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            with contextlib.suppress(Exception):  # the keep-alives decide where this cannot tell
                self._holder.sync()
                state = self._holder.state
                self._gone([node for node in state.participants
                            if node != self._node and repr(node) not in self.answered])
        finally:
            self._lock.release()

    def _gone(self, suspects: list[Any]) -> list[Any]:
        store, keys = self._handler._store, {node: self._key(node) for node in suspects}
        if not keys:
            return []
        # Two requests to node 0's store, not two a member (every agent knocks every new member after a round).
        # Only published keys are read: never a get that would wait for a key.
        published = list(keys) if store.check(list(keys.values())) else [n for n in keys if store.check([keys[n]])]
        values = store.multi_get([keys[node] for node in published]) if published else []
        ports = {node: self._where(node, value) for node, value in zip(published, values, strict=True)}
        if not ports:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(MOST_KNOCKS, len(ports))) as pool:
            answers = dict(zip(ports, pool.map(lambda n: knock(*ports[n]), ports), strict=True))
        self.answered |= {repr(node) for node, alive in answers.items() if alive}
        return [node for node, alive in answers.items() if alive is False and repr(node) in self.answered]

    def _sweep_until(self, done: threading.Event) -> None:
        said = False
        while not done.wait(EVERY_SECONDS):
            try:
                with self._lock:
                    if done.is_set():  # the round formed while a stuck sweep held the state: the workers fork now
                        return
                    self._sweep()
            except Exception as exc:  # the store slow or gone: tried again at the next sweep; the keep-alives decide
                if not said:
                    print(f"finetune agent: a presence sweep failed ({exc!r}); trying again every "
                          f"{EVERY_SECONDS:.0f} s while this node joins", file=sys.stderr, flush=True)
                said = True

    def _where(self, node: Any, value: bytes | str) -> tuple[str, int]:
        """(address, port) a member published; its node name where it published no address, or a loopback one
        while this node's is not (a node 0 that reached its own store through 127.0.0.1)."""
        text = value.decode() if isinstance(value, bytes) else value
        port, _, address = text.partition(" ")
        if not address or (_loopback(address) and not _loopback(self._address)):
            address = node.addr
        return address, int(port)

    def _key(self, node: Any) -> str:
        return self._prefix + repr(node)

    @staticmethod
    def _listen() -> socket.socket:
        """A port on every address of this node; accepted and closed at once by a thread (the kernel answers even
        while that thread does not run, and the backlog never fills)."""
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", 0))

        def accept() -> None:
            while True:
                try:
                    server.accept()[0].close()
                except OSError:  # out of descriptors, say: a pause, not a spin (the kernel still answers knocks)
                    time.sleep(0.5)

        threading.Thread(target=accept, daemon=True, name="finetune-presence").start()
        return server

