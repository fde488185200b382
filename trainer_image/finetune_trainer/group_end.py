"""The end of a group, for a node that waited for a place in it (finetune_trainer.agent.run_elastic).

A node that finds the round full (a replacement pod whose lost predecessor's keep-alives have not expired yet) waits
in torch's redundancy list, usually until the lost one is swept out. When the group ends first, the agent that ends
it closes the rendezvous, whatever the group's outcome, and torch tells the waiting node to exit with no result
(its launcher then failed on it). Each agent leaves its group's outcome in the rendezvous's store before the close;
the waiting node ends as the group did, 0 or 1, and says that it did not train. The store lives in node 0's agent,
which waits (bounded) after the close until each waiting node has read it.
"""

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c


def store_key(handler: Any, *parts: str) -> str:
    """A key of ours in a rendezvous's store: under its run id, apart from torch's own keys."""
    return ".".join(("finetune", handler.get_run_id(), *parts))


class GroupFailedWithout(Exception):
    """This node waited for a place in a group that ended without success (or without saying how)."""


class GroupEnd:
    """A group's end in its rendezvous's store (counters under the run id): how many agents ended succeeded or
    failed (each before torch's launcher closes the rendezvous), and how many waiting nodes have read it. Nothing
    for a handler that is not torch's c10d one."""

    READ_SECONDS = 10.0  # a waiting node polls the state every second; more on a busy node
    CALL_SECONDS = 5.0  # one store call

    def __init__(self, handler: Any) -> None:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

        dynamic = isinstance(handler, DynamicRendezvousHandler)
        self._handler, self._store = handler, handler._store if dynamic else None
        self._succeeded, self._failed, self._read = (store_key(handler, "end", k) if dynamic else k
                                                     for k in ("succeeded", "failed", "read"))

    def record(self, failed: bool) -> None:
        if self._store is not None and _bounded(lambda: self._store.add(self._failed if failed else self._succeeded,
                                                                        1), self.CALL_SECONDS) is None:
            print("finetune agent: could not record the group's end (the rendezvous's store did not answer): a "
                  "node waiting for a place in the group then fails", file=sys.stderr, flush=True)

    def succeeded(self) -> bool | None:
        """True when the agents that ended it succeeded, False when one failed, None when none said or the store
        did not answer."""
        if self._store is None:
            return None
        counts = _bounded(lambda: (self._store.add(self._succeeded, 0), self._store.add(self._failed, 0)),
                          self.CALL_SECONDS)
        if counts is None:
            return None
        return False if counts[1] else (True if counts[0] else None)

    def after_close(self, waited: bool) -> None:
        """A node that waited says it has read the end; the others wait (bounded) until each node of torch's
        redundancy list has: the store lives in node 0's agent, and ends with it."""
        if self._store is not None:
            _bounded(lambda: self._after_close(waited), self.READ_SECONDS + self.CALL_SECONDS)

    def _after_close(self, waited: bool) -> None:
        if waited:
            self._store.add(self._read, 1)
            return
        with self._handler._heartbeat_lock:
            self._handler._state_holder.sync()
            waiting = len(self._handler._state_holder.state.redundancy_list)
        deadline = time.monotonic() + self.READ_SECONDS
        while waiting and self._store.add(self._read, 0) < waiting and time.monotonic() < deadline:
            time.sleep(0.1)


def _bounded(call: Callable[[], Any], seconds: float) -> Any:
    """call()'s value, or None where it raised or took longer than `seconds`: a store call can block for the
    store's read timeout (minutes) on a host gone without a reset, past the pod's grace period."""
    out: list[Any] = []

    def run() -> None:
        with contextlib.suppress(Exception):  # the store is gone
            out.append(call())

    thread = threading.Thread(target=run, name="group-end", daemon=True)
    thread.start()
    thread.join(seconds)
    return out[0] if out else None


def ended_while_redundant(agent_run: Callable[..., Any], waited: list[bool]) -> Callable[..., Any]:
    """torch's agent.run, which records its group's end (GroupEnd) and gives a result where torch's returns none:
    a node that found the round full (one more than maxNodes, or a replacement pod whose lost predecessor's
    keep-alives had not expired) waits in torch's redundancy list; when the group ends, the rendezvous is closed
    and torch tells the waiting node to exit gracefully, but its agent returns None and torch's launcher then
    failed on it (AttributeError). The node ends as its group did, having not trained: a success (its work was done
    by the others) or GroupFailedWithout."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.multiprocessing import SignalException

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        end = GroupEnd(self._worker_group.spec.rdzv_handler)
        try:
            result = agent_run(self, *args, **kwargs)
        except SignalException:  # a stop: torch's launcher leaves the rendezvous open
            raise
        except Exception:  # torch's launcher closes the rendezvous after any other
            end.record(failed=True)
            raise
        if result is not None:
            end.record(failed=result.is_failed())
            return result
        waited.append(True)
        succeeded = end.succeeded()
        outcome = ("finished without this node" if succeeded else "failed" if succeeded is False
                   else "ended without saying how (node 0's agent gone)")
        message = (f"the group {outcome} while this node waited for a place in it (the group was full): this node "
                   "did not train in it")
        print(f"finetune agent: {message}", file=sys.stderr, flush=True)
        _write_agent_result(0 if succeeded else 1, message)
        if succeeded:
            return RunResult(state=WorkerState.SUCCEEDED)
        raise GroupFailedWithout(message)

    return run


def _write_agent_result(code: int, message: str) -> None:
    """This node's result for its launcher (launch.aggregate), in place of a worker's: none ran."""
    from finetune_operator.api import exit_codes

    directory = os.environ.get(c.ENV_RESULT_DIR)
    if directory:
        result = {"exitCode": code, "reason": exit_codes.reason(code), "message": message}
        Path(directory, "result-agent.json").write_text(json.dumps(result))
