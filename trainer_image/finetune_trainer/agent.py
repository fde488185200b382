"""torchrun's agent for every attempt of more than one process, with the trainer's libraries imported once per pod
instead of once per worker (and once more by torchrun itself).

Each worker of torchrun's `--module` imports torch, transformers, peft, datasets and accelerate (about 7 s of CPU),
and torchrun imports torch before them: at every attempt's start, and again for every worker of a group re-formed
in place (a failed worker, a lost node, a joining one), which is most of a recovery (seconds on a GPU node, half a
minute on a busy CPU). Here the agent imports them first and forks its workers (torch elastic's "fork" start method
for a function entrypoint), so a new worker starts with them loaded.
The agent itself is torchrun's (`torch.distributed.run`'s arguments, read from the same PET_* variables), only the
entrypoint differs: finetune_trainer.main in the forked process, its exit code the worker's.

Forking is safe here because the agent has touched no GPU (torch's CUDA check goes through NVML, which creates no
CUDA context) and no process group; the libraries a job cannot use are left out first (unused_libraries.py), as
in a worker.

A group never trains with fewer nodes than the job's minimum (PET_NNODES MIN:MAX, or N for a fixed gang). torch's
rendezvous can form one: it counts the world once a round is complete, and a participant swept out for missed
keep-alives between the round's completion and that count (an agent starved of CPU on a loaded node, alive and
about to join again) leaves the others a world below min_nodes; on a busy machine a 3-node job (min 2) went on,
and ended Succeeded, on 1. Such a group's workers wait instead of training: the agent that was swept out asks to
join the next round, and torch's agent restarts the group for it (a membership change, not counted as a failure).
One that nobody joins within the rendezvous's join timeout exits as a failed worker.

A pod that is stopped (deleted, preempted, evicted: SIGTERM) takes its node out of the rendezvous on its way out
(`run_elastic`). torch leaves a stopped agent in the round it completed (shutting the rendezvous down
would close it for every node), so the survivors' next round could form only once its keep-alives had expired
(RDZV_KEEP_ALIVE_SECONDS x RDZV_KEEP_ALIVE_MISSED, 10 s). A node killed outright (its container, an OOM kill) is
left out as soon as its agent's port refuses a knock (presence.py); only a node whose host or network is gone still
takes the 10 s.

A node waiting to join makes the group stop at a step end and re-form with it (a growth). Should the new round
complete without it (an agent starved of CPU that missed the round's 3 s last call), it is still waiting, and the
group would stop and re-form again at once, and again: on a loaded machine a 3-node job re-formed on the same 2
nodes five times in a row, saving and reloading each time. So every node of a growth (the group's, which see a
node waiting, and the joining one, which sees a group under way) joins its round with a longer last call: 30 s
instead of 3. A round closes at once when the job's numNodes are in, so a prompt joiner costs nothing; a round that
cannot reach numNodes while a node waits (two nodes lost and one back, a joiner stopped before its keep-alives
expire) waits the 30 s; a shrink with no node waiting keeps the 3 s. `GrowthThrottle` also waits before trying a
growth that missed anyway again (30 s, doubling up to 8 minutes) and tries at once again after one that succeeds.
A stopped node that was still waiting to join takes itself off torch's wait list as it leaves.

A node that waited for a place in a full group when the group ended exits as the group did (group_end.py).
"""

import argparse
import atexit
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from finetune_operator.api import constants as c
from finetune_trainer.group_end import GroupEnd, GroupFailedWithout, ended_while_redundant
from finetune_trainer.launch import restarts_in_place
from finetune_trainer.presence import Presence

# Imported by every worker before its first step (finetune_trainer.main and what it imports lazily).
PRELOAD = ("torch", "torch.distributed", "accelerate", "datasets", "peft", "transformers", "transformers.trainer",
           "transformers.modeling_utils", "transformers.models.auto.modeling_auto", "finetune_trainer.main",
           "finetune_trainer.training.trainer", "finetune_trainer.training.callbacks",
           "finetune_trainer.training.worker_report", "finetune_trainer.training.model", "finetune_trainer.data",
           "finetune_trainer.outputs.status_report")
ENV_NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
ENV_ELASTIC_LOG_LEVEL = "LOGLEVEL"  # torch.distributed.elastic.utils.logging reads it


def preload(config: str) -> None:
    from finetune_trainer.config import load_config
    from finetune_trainer.unused_libraries import leave_out, unused_libraries

    leave_out(unused_libraries(load_config(config).spec))
    for name in PRELOAD:
        importlib.import_module(name)


def below_minimum(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(nodes in this worker's group, the job's minimum) when the group is smaller than the minimum, else None."""
    nnodes = env.get(c.ENV_PET_NNODES, "1")
    try:
        fewest = int(nnodes.split(":", 1)[0])
        group = int(env.get(c.ENV_GROUP_WORLD_SIZE, str(fewest)))
    except ValueError:
        return None
    return (group, fewest) if group < fewest else None


def wait_for_quorum(group: int, fewest: int, timeout: float) -> None:
    """Holds a group below its minimum until the agent restarts it (SIGTERM) or `timeout` passes; exits 1 then."""
    print(f"finetune agent: the rendezvous formed a group of {group} node(s), fewer than the job's minimum of "
          f"{fewest} (an agent it took for lost after the group formed, e.g. one starved of CPU past its keep-alives): "
          f"these workers do not train and wait for it to join again (their agent then re-forms the group)",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
    print(f"finetune agent: no node joined within {timeout:.0f} s; the group of {group} node(s) ends as a failed "
          f"worker", file=sys.stderr, flush=True)
    sys.exit(1)


def train(config: str) -> None:
    """One worker: the trainer's main(); a failure's exit code is the process's. Not in a group below the job's
    minimum of nodes."""
    from finetune_trainer.launch import RDZV_JOIN_TIMEOUT_SECONDS
    from finetune_trainer.main import main

    short = below_minimum(os.environ)
    if short is not None:
        wait_for_quorum(*short, timeout=RDZV_JOIN_TIMEOUT_SECONDS)
    code = main(["--config", config])
    if code:
        sys.exit(code)


def forked_worker(config: str) -> None:
    """The entrypoint each forked worker runs: train(), with the exit handlers of a process of its own. A forked
    worker ends through multiprocessing's os._exit, which skips them (the output prefix's owner record is released
    by one, trackers flush in others), and the agent's, copied by the fork, are the agent's: the worker runs its
    own, and only those, as it ends. weakref.finalize (TemporaryDirectory, datasets' temporary caches) keeps its
    own registry and registers its exit hook once per process: the copies of the agent's finalizers are dropped and
    the hook armed again for the worker's."""
    atexit._clear()
    weakref.finalize._registry.clear()  # type: ignore[attr-defined]
    weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined]
    try:
        train(config)
    finally:
        atexit._run_exitfuncs()


def leave(handler: object, timeout: float = 10.0) -> bool:
    """Takes this node out of the participants of the rendezvous `handler` joined (torch's own exit operation, the
    one its agents run before joining a new round), or off its wait list, and stops its keep-alives. False where
    the handler is not torch's dynamic (c10d) one or the store cannot be reached: the others then see it gone once
    its keep-alives expire."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    if not isinstance(handler, dynamic.DynamicRendezvousHandler):
        return False
    failed: list[BaseException] = []

    def off_wait_list(ctx: Any, deadline: float) -> Any:  # a node still waiting to join: torch's exit op skips it
        if ctx.node not in ctx.state.wait_list:
            return dynamic._Action.FINISH
        return dynamic._Action.ERROR_TIMEOUT if time.monotonic() > deadline else dynamic._Action.REMOVE_FROM_WAIT_LIST

    def exit_round() -> None:
        try:
            handler._stop_heartbeats()
            handler._op_executor.run(dynamic._RendezvousExitOp(), time.monotonic() + timeout)
            handler._op_executor.run(off_wait_list, time.monotonic() + timeout)
        except BaseException as exc:  # a second stop signal included
            failed.append(exc)

    # In a thread joined with the timeout: one store call can block for the store's read timeout (minutes) on a
    # host that is gone without a reset, past the pod's grace period.
    leaving = threading.Thread(target=exit_round, name="leave-rendezvous", daemon=True)
    leaving.start()
    leaving.join(timeout)
    if leaving.is_alive() or failed:
        why = f"{type(failed[0]).__name__}: {failed[0]}" if failed else f"no answer within {timeout:.0f} s"
        print(f"finetune agent: could not leave the rendezvous ({why}); the other nodes see this one gone once its "
              f"keep-alives expire", file=sys.stderr, flush=True)
        return False
    return True


# A round joined while a node waits to join closes this long after the fewest nodes are in, unless every node is in
# before: a waiting agent starved of CPU took longer than the usual last call (launch.RDZV_LAST_CALL_SECONDS).
GROWTH_LAST_CALL_SECONDS = 30.0


class GrowthThrottle:
    """Wraps a rendezvous handler's view of the nodes waiting to join (what torch's agent reads to decide a
    growth) and each round it joins. A growth's round (a node not of this group waits to join, or this one joins a
    group under way) gets the longer last call (growth_last_call, where the handler is torch's c10d one). After a
    round that came out smaller than the group plus the joiners it restarted for, those read as none for a pause
    (first_pause, doubling up to longest). torch's wait list also holds the group's own members between rounds (a
    node whose worker failed, the first survivor of a shrink to rejoin): those are no joiners."""

    def __init__(self, handler: Any, first_pause: float = 30.0, longest: float = 480.0,
                 growth_last_call: float = GROWTH_LAST_CALL_SECONDS) -> None:
        self.first_pause, self.longest = first_pause, longest
        # torch's own timeouts object, which the handler and its operations read at each join (None: not c10d's)
        self._handler, self._timeouts = handler, getattr(getattr(handler, "_settings", None), "timeout", None)
        self.growth_last_call = timedelta(seconds=growth_last_call)
        self.pause, self.until = 0.0, 0.0
        self.world: int | None = None  # nodes in the last round this agent joined
        self.members: set[Any] = set()  # and which (torch's node descriptors; c10d only)
        self.expected: int | None = None  # nodes the growth it restarted for would have
        self._waiting, self._next = handler.num_nodes_waiting, handler.next_rendezvous
        handler.num_nodes_waiting, handler.next_rendezvous = self.num_nodes_waiting, self.next_rendezvous

    def num_nodes_waiting(self) -> int:
        waiting = self._waiting()
        if waiting and time.monotonic() < self.until:
            return 0
        if waiting and self.world is not None:
            state = self._state()
            joiners = waiting if state is None else len(state.wait_list - self.members)
            self.expected = self.world + joiners if joiners else None
        return waiting

    def next_rendezvous(self) -> Any:
        joined = self._join()
        world = joined.world_size
        if self.expected is not None and world < self.expected:
            self.pause = min(self.longest, max(self.first_pause, 2 * self.pause))
            self.until = time.monotonic() + self.pause
            print(f"finetune agent: the group re-formed on {world} node(s), not the {self.expected} it stopped for "
                  f"(a waiting node missed the round); next growth tried in {self.pause:.0f} s", file=sys.stderr,
                  flush=True)
        elif self.expected is not None:
            self.pause = 0.0
        state = self._state()
        self.expected, self.world, self.members = None, world, state.participants if state is not None else set()
        return joined

    def _join(self) -> Any:
        """The next round; with the longer last call when it is a growth's. Every node of a growth takes it, since
        the round's deadline is set by whichever of them brings it to the fewest nodes, with its own last call."""
        usual = getattr(self._timeouts, "_last_call", None)
        state = self._state() if usual is not None and usual < self.growth_last_call else None
        node = getattr(self._handler, "_this_node", None)
        if state is None or not (state.wait_list - self.members - {node}  # a joiner waits
                                 or (state.complete and node not in state.participants)):  # this one joins
            return self._next()
        self._timeouts._last_call = self.growth_last_call
        try:
            return self._next()
        finally:
            self._timeouts._last_call = usual

    def _state(self) -> Any:
        """torch's rendezvous state as the store has it now: complete, participants, wait list (copies); None for a
        handler that is not torch's c10d one."""
        holder, lock = getattr(self._handler, "_state_holder", None), getattr(self._handler, "_heartbeat_lock", None)
        if holder is None or lock is None:
            return None
        with lock:  # its keep-alive thread syncs the same state
            holder.sync()
            state = holder.state
            return SimpleNamespace(complete=bool(state.complete), participants=set(state.participants),
                                   wait_list=set(state.wait_list))


def method_name(depth: int = 2) -> str:
    """torch's rendezvous `get_method_name` (the name of its event records), without `inspect.stack()`: that reads
    the source of every frame on the stack, twice, to name one (~13 ms with the trainer's libraries loaded, at every
    step of a join and every keep-alive; several times that on a starved core, where it widened the window between a
    joining node's read of the state and its write until the members' keep-alives won every race)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def run_elastic(launch: Callable[[], object]) -> int:
    """Runs `launch` (torch's elastic launch) with its rendezvous handler's growths throttled (GrowthThrottle);
    stopped by a signal, leaves the rendezvous it joined, then re-raises. Each group's end goes to the rendezvous's
    store for a node that waited for a place in it (group_end.py), which exits as the group did: the exit code. The
    handler is the one torch's launcher creates (recorded as it is made: the launcher keeps it to itself)."""
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dynamic
    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing import SignalException

    handlers: list[object] = []
    create = registry.get_rendezvous_handler

    def recorded(params: object) -> object:
        handlers.append(create(params))
        GrowthThrottle(handlers[-1])
        Presence(handlers[-1])  # wraps the throttle's join: a killed member is swept while this node joins
        return handlers[-1]

    registry.get_rendezvous_handler = recorded
    named = dynamic.get_method_name
    dynamic.get_method_name = method_name
    agent_run = SimpleElasticAgent.run
    waited: list[bool] = []
    SimpleElasticAgent.run = ended_while_redundant(agent_run, waited)
    stopped = False
    try:
        launch()
        return 0
    except SignalException:
        stopped = True
        for handler in handlers:
            if leave(handler):
                print("finetune agent: stopped; left the rendezvous so the other nodes re-form without waiting for "
                      "this one's keep-alives to expire", file=sys.stderr, flush=True)
        raise
    except GroupFailedWithout:
        return 1
    finally:
        registry.get_rendezvous_handler = create
        SimpleElasticAgent.run = agent_run
        dynamic.get_method_name = named
        if not stopped:  # the rendezvous is closed (torch's launcher closes it unless stopped by a signal)
            for handler in handlers:
                GroupEnd(handler).after_close(waited=bool(waited))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer.agent")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault(ENV_NVML_CUDA_CHECK, "1")  # before torch: its GPU check must not initialize CUDA
    # torch elastic's own log at INFO: each rendezvous round joined, its rank and world, each restart and why (a few
    # lines per re-formed group, in the pod's log where a lost node's recovery is read).
    os.environ.setdefault(ENV_ELASTIC_LOG_LEVEL, "INFO")
    # `kill -USR1` on a pod's agent prints where each of its threads is (a rendezvous that does not end says where).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    preload(args.config)
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    launch = get_args_parser().parse_args(["--start-method=fork", "--module", "finetune_trainer", "--config",
                                           args.config])
    launch_config, _, _ = config_from_args(launch)
    if not restarts_in_place(os.environ):  # a fixed gang: torch's static rendezvous, nothing to re-form
        elastic_launch(launch_config, entrypoint=forked_worker)(args.config)
        return 0
    return run_elastic(lambda: elastic_launch(launch_config, entrypoint=forked_worker)(args.config))


if __name__ == "__main__":
    sys.exit(main())
