"""While the data is tokenized (minutes, or hours for a large corpus), the job must not look stalled or time out.

- Rank 0 keeps the heartbeat going: a `Preparing` record in progress.jsonl and in status.progress every
  HEARTBEAT_SECONDS (what is being done, rows so far), so the operator's stall watchdog does not restart a gang
  that is working, and `kubectl get ftj` / `finetune run` say what happens.
- The other ranks wait in a barrier of their own (gloo, DATA_BARRIER_TIMEOUT) instead of the training group's,
  whose collective timeout (minutes) would fire long before a large dataset is tokenized.
- Rank 0 speaks for the other nodes' tokenizing processes only while they are heard from (peer_liveness.py).
"""

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_operator.api import constants as c
from finetune_trainer.data.peer_liveness import NodeBeat, PeerWatch, default_store, watched_ranks
from finetune_trainer.outputs.status_report import StatusReporter

if TYPE_CHECKING:
    from finetune_trainer.config import TrainerConfig

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 30.0
DATA_BARRIER_TIMEOUT = timedelta(hours=24)


class PreparingHeartbeat:
    """A thread that reports what the data preparation is doing until it is stopped; silent while a process of
    another node that `peers` watches is (its last record says which)."""

    def __init__(self, output_dir: Path, reporter: StatusReporter | None, interval: float = HEARTBEAT_SECONDS,
                 peers: PeerWatch | None = None):
        self.path, self.reporter, self.interval, self.peers = output_dir / c.PROGRESS_FILE, reporter, interval, peers
        self.message = "loading the data"
        self.started = time.monotonic()
        self._held_for: tuple[int, ...] = ()  # the ranks the heartbeat is held back for, said once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preparing-heartbeat", daemon=True)

    def update(self, message: str) -> None:
        self.message = message
        self.beat()

    def _silent_peers(self) -> dict[int, float]:
        try:
            return self.peers.silent() if self.peers is not None else {}
        except Exception as exc:  # the store away: the group is failing, and its agent says so
            log.warning("cannot read the other nodes' beats: %s", exc)
            return {}

    def beat(self) -> None:
        """Never raises: a heartbeat that cannot be written must not keep rank 0 from the collective the other
        ranks wait in (they would wait out its 24 h timeout)."""
        quiet = self._silent_peers()
        message = self.message
        if quiet:
            if tuple(quiet) == self._held_for:
                return  # said already: nothing more until they are heard from again
            self._held_for = tuple(quiet)
            ranks = ", ".join(f"rank {r} ({round(s)} s)" for r, s in quiet.items())
            message = (f"no sign of life from the process tokenizing on another node: {ranks}; the heartbeat stops "
                       "so that the stall watchdog (runPolicy.stallTimeoutSeconds) restarts the gang")
            log.warning("%s", message)
        elif self._held_for:
            log.info("the other nodes are heard from again: the heartbeat goes on")
            self._held_for = ()
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "phase": "Preparing",
                  "message": message, "elapsedSeconds": round(time.monotonic() - self.started)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.reporter is not None:
                self.reporter.report({"progress": {"phase": "Preparing", "message": message,
                                                   "updatedAt": record["time"]}}, force=True)
        except Exception as exc:  # the file's volume full or read-only, the API server away: said, not fatal
            log.warning("cannot report the data preparation's progress: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def __enter__(self) -> "PreparingHeartbeat":
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextmanager
def rank_zero_first(first: bool, world_size: int) -> Iterator[None]:
    """The `first` processes run the body first (tokenize and cache); the others wait with a long timeout, then run
    it (and load the cache). Like TrainingArguments.main_process_first, but not bounded by the collective timeout."""
    import torch.distributed as dist

    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        yield
        return
    group = dist.new_group(backend="gloo", timeout=DATA_BARRIER_TIMEOUT)
    if not first:
        dist.barrier(group=group)
    try:
        yield
    finally:
        if first:
            dist.barrier(group=group)


def prepare_data(cfg: "TrainerConfig", args: Any, tokenizer: Any, reporter: StatusReporter | None) -> Any:
    """The run's data as its objective takes it: GRPO's prompts, preference pairs, streamed rows, or SFT rows
    tokenized once by rank 0 (with a heartbeat) and loaded from the cache by the other ranks."""
    from finetune_trainer.data import prepare

    if cfg.spec.method.objective == "grpo":  # prompts (and the columns rewards read), checked here
        from finetune_trainer.data.prompts import prepare_prompts

        return prepare_prompts(cfg.spec.data, cfg.spec.method.grpo, tokenizer, args.seed)
    if cfg.spec.method.objective != "sft":  # pairs, checked here and tokenized by TRL's trainer
        from finetune_trainer.data.preference import prepare_preference

        sequential = cfg.spec.training.extra_args.get("train_sampling_strategy") == "sequential"  # the data's order
        return prepare_preference(cfg.spec.data, tokenizer, args.seed, cfg.spec.method.objective, sequential)
    if cfg.spec.data.streaming:
        from finetune_trainer.data.streaming import prepare_streaming

        return prepare_streaming(cfg.spec.data, tokenizer, args.seed)

    # Rank 0 tokenizes and caches, reporting a heartbeat; the others wait, then load the cache instead of
    # tokenizing inside a collective. A cache of each node's own: the first process of every node tokenizes.
    cache = cfg.cache / "tokenized"
    first = args.local_process_index == 0 if cfg.cache_node_local else args.process_index == 0
    store = default_store() if cfg.cache_node_local and args.world_size > 1 else None
    if args.process_index != 0:
        with rank_zero_first(first, args.world_size):
            if not (first and store is not None):
                return prepare(cfg.spec.data, tokenizer, cache, args.seed)
            with NodeBeat(store, args.process_index):
                return prepare(cfg.spec.data, tokenizer, cache, args.seed)
    # The heartbeat goes on while rank 0 waits for the other nodes (each tokenizing into its own cache, a new pod
    # of an elastic gang from scratch), as long as they are heard from: the stall watchdog hears from it all along.
    peers = None if store is None else PeerWatch(store, watched_ranks(
        args.world_size, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    with PreparingHeartbeat(cfg.output_dir, reporter, peers=peers) as heartbeat, \
            rank_zero_first(first, args.world_size):
        prepared = prepare(cfg.spec.data, tokenizer, cache, args.seed, on_progress=heartbeat.update)
        if args.world_size > 1 and cfg.cache_node_local:
            heartbeat.update("waiting for the other nodes to tokenize the data into their own caches")
        return prepared
