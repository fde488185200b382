"""Checkpoints that do not stall training. A save splits in two, as CheckFreq does (Mohan et al., FAST '21): the
copy of what the checkpoint holds (the weights it saves, the optimizer states) into reused host buffers runs in a
background thread while the next step's forward and backward run, since they read the weights and leave the
optimizer states alone; the optimizer's next step waits for the copy (`CopyBeforeStep`: that wait, if any, is
stall). The same thread then writes the copy with the Trainer's own writers (save_pretrained, torch.save), verifies
it and marks it complete (checkpoints.mark_complete), then rotates the old ones. What the loop itself does at a
save is small and must see this very step: the RNG and scheduler states, the trainer state. The completion marker
stays the rule: a checkpoint whose write was cut short has none and is never resumed from.

One write is in flight at a time: a save that comes while the last one is still being written waits for it (that
wait is stall too). Training's end, a stop and a crash all wait for the write in flight (drain) before the process
says anything about its checkpoints.

Used where the Trainer's save is rank 0's alone (DDP, one process); sharded states (FSDP, DeepSpeed), object
storage uploads (output.uri has its own background upload), checkpoint pushes and early stopping keep the
synchronous save. A best checkpoint tracked without early stopping (extraArgs.metric_for_best_model,
load_best_model_at_end, a plateau scheduler) is recorded as the Trainer's save records it (best_checkpoint), and the
end of training, which loads it and removes the others, waits for the write in flight.
"""

import copy
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def overlapped(spec: Any) -> bool:
    """Whether a job's checkpoints are written in the background (checkpoints.overlap, where it applies)."""
    d = spec.distributed
    push = spec.output.push
    return (spec.checkpoints.overlap and d.strategy == "ddp" and not spec.output.uri
            and (push is None or push.strategy != "checkpoint") and spec.evaluation.early_stopping is None)


def snapshot(value: Any, into: Any = None) -> Any:
    """A copy of `value` whose tensors live in host memory and share nothing with the training's (dicts, lists and
    tuples walked; anything else is immutable or copied by the caller). `into`: the last snapshot of the same
    structure, whose buffers are reused (no new allocation, no page faults: the copy is all that stalls); pinned
    memory when the tensors are on a GPU, so the device-to-host copy runs at full speed."""
    import torch

    if isinstance(value, torch.Tensor):
        if (isinstance(into, torch.Tensor) and into.shape == value.shape and into.dtype == value.dtype
                and into.device.type == "cpu"):
            return into.copy_(value.detach())
        if value.device.type == "cuda":
            return torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value.detach())
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        old = into if isinstance(into, dict) else {}
        return {k: snapshot(v, old.get(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        old = into if isinstance(into, (list, tuple)) and len(into) == len(value) else [None] * len(value)
        return type(value)(snapshot(v, o) for v, o in zip(value, old, strict=True))
    return value


def saved_state(model: Any, into: Any = None) -> dict[str, Any]:
    """The weights a checkpoint of `model` saves, as references (no copy): for a PEFT model the tensors PEFT itself
    picks to save (the active adapter's, and the embeddings only when it would save them), not the frozen base;
    every tensor otherwise. save_pretrained picks the same out of them as out of the whole state. Taken in the
    training loop's thread at the save: the next step may switch the active adapter (TRL's reference forward on a
    frozen "ref" copy of it) while the copy runs."""
    state = model.state_dict()
    if isinstance(into, dict) and into.keys() <= state.keys():
        state = {k: state[k] for k in into}  # what PEFT picked at the first save: the same all run long
    elif hasattr(model, "peft_config") and hasattr(model, "active_adapter"):
        from peft.utils import get_peft_model_state_dict

        adapter = model.active_adapter
        saved = set(get_peft_model_state_dict(model, adapter_name=adapter))  # references, no copy
        # peft names a saved tensor without its adapter, and a modules_to_save copy (a reward model's score head)
        # without its wrapper too ("score.weight" for "score.modules_to_save.default.weight"), while its save reads
        # the wrapped name back out of the state it is given: keep those by their wrapper's name.
        wrapped = f".modules_to_save.{adapter}."
        state = {k: v for k, v in state.items()
                 if k in saved or k.replace(f".{adapter}", "") in saved or wrapped in k}
    return state


def trainer_state_copy(state: Any) -> Any:
    """The Trainer's state as it is now, written later (TrainerState.save_to_json in the writer's thread): a shallow
    copy whose containers are copied too. The loop only appends to the log history (a callback may still add a key
    to its last entry), so each entry is copied, not the values in it; a deep copy and the JSON of a log history that
    grows with every logged step would be stall."""
    taken = copy.copy(state)
    taken.log_history = [dict(entry) for entry in state.log_history]
    taken.stateful_callbacks = copy.deepcopy(state.stateful_callbacks)
    taken.trial_params = copy.deepcopy(state.trial_params)
    return taken


def lower_priority(niceness: int = 10) -> None:
    """The calling thread yields the CPU to training: a thread's nice value is its own on Linux (setpriority on its
    thread id), so a write that shares the cores with the training loop takes what the loop leaves idle instead of
    slowing its steps. Elsewhere a no-op."""
    try:
        tid = threading.get_native_id()  # relative to the process's own (a niced job stays below its loop)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except (AttributeError, OSError):
        pass


class CopyBeforeStep:
    """Holds the optimizer's next step until the checkpoint's copy is taken (done()): a step would change the
    weights and states being copied. Registered on the optimizer that steps (a hook on its step); removed by the
    training loop's thread (remove()), never from inside the hooks' own iteration."""

    def __init__(self, optimizer: Any) -> None:
        self.copied = threading.Event()
        self.waited = 0.0  # what the loop's step waited for the copy
        self._entered = threading.Event()  # the loop's step came while the copy was under way
        self._accounted = threading.Event()
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper steps the torch optimizer
        self._handle = inner.register_step_pre_hook(self._before_step)

    def _before_step(self, *_: Any) -> None:
        if self._accounted.is_set():
            return
        self._entered.set()
        started = time.monotonic()
        try:
            self.copied.wait()
        finally:  # stall() must never wait for an account that will not come
            self.waited = time.monotonic() - started
            self._accounted.set()

    def done(self) -> None:
        self.copied.set()

    def stall(self) -> float:
        """After done(): what the loop's step waited for the copy (0 where no step came before it was taken)."""
        if self._entered.is_set():
            self._accounted.wait()
        return self.waited

    def remove(self) -> None:
        self._handle.remove()


class CheckpointWriter:
    """One background write at a time; its failure is raised in the training loop at the next save or drain."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.buffers: dict[str, Any] = {}  # the last snapshot, reused by the next once it is written
        self.hold: CopyBeforeStep | None = None

    def wait(self) -> float:
        """Blocks until the write in flight is done; the seconds waited. Re-raises its failure."""
        started = time.monotonic()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.hold is not None:
            self.hold.remove()  # the training loop's thread: no step is iterating the optimizer's hooks now
            self.hold = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return time.monotonic() - started

    drain = wait

    def submit(self, name: str, write: Callable[[], None], copy: Callable[[], None] = lambda: None) -> None:
        """copy() at the thread's normal priority (the next optimizer step may be waiting for it: self.hold), then
        write() at a lower one."""
        hold = self.hold

        def run() -> None:
            try:
                try:
                    copy()
                finally:
                    if hold is not None:
                        hold.done()  # a failed copy must not hold training: its error is raised below
                lower_priority()
                write()
            except BaseException as exc:  # handed to the training loop, which raises it
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"checkpoint-writer-{name}", daemon=False)
        self.thread.start()


def rng_states(trainer: Any) -> dict[str, Any]:
    """What the Trainer's _save_rng_state writes, taken in memory (the states themselves are copies): the
    random, numpy and torch generators, and CUDA's where there is a GPU (every device's when distributed)."""
    import random

    import numpy as np
    import torch
    from transformers.training_args import ParallelMode

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        distributed = trainer.args.parallel_mode == ParallelMode.DISTRIBUTED
        states["cuda"] = torch.cuda.random.get_rng_state_all() if distributed else torch.cuda.random.get_rng_state()
    return states


def best_checkpoint(trainer: Any, run_dir: str, step: int) -> str | None:
    """The best checkpoint as transformers' _save_checkpoint records it at a save (state.best_model_checkpoint: the
    final model with load_best_model_at_end, a resume, the summary read it, and rotation keeps it): the checkpoint
    of the best evaluation's step, once saved. Tracked wherever metric_for_best_model is set (extraArgs, or
    transformers' own "loss" for load_best_model_at_end or a plateau scheduler), early stopping or not. The save
    being made now counts: every rank knows the step rank 0 is writing. None: unchanged."""
    best_step = trainer.state.best_global_step
    if not best_step or trainer.args.save_strategy not in ("steps", "epoch", "best"):
        return None
    path = os.path.join(run_dir, f"checkpoint-{best_step}")
    return path if best_step == step or os.path.isdir(path) else None


def rng_file_name(trainer: Any) -> str:
    """The Trainer's name for this process's RNG file in a checkpoint (what its resume reads)."""
    return "rng_state.pth" if trainer.args.world_size <= 1 else f"rng_state_{trainer.args.process_index}.pth"


def save_in_background(trainer: Any, writer: CheckpointWriter, marked: Any, trial: Any) -> None:
    """The Trainer's _save_checkpoint, overlapped: what must see this very step taken here (the RNG states, the
    scheduler and trainer states; the other ranks write their RNG files at once, as the Trainer does); the weights
    and optimizer states copied by the writer's thread before the next optimizer step (CopyBeforeStep), then
    written with rank 0's RNG file, marked complete (`marked`: CheckpointMarkerCallback) and rotated. Rank 0 writes
    the checkpoint. The same files as the Trainer's save: the fp16 loss scaler's state too, and with
    transformers' save_only_model (which a job's extraArgs may not set) the weights and the trainer state alone."""
    import torch
    from transformers.trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME, ExportableState
    from transformers.trainer_utils import rotate_checkpoints

    started = marked.save_started or time.monotonic()
    writer.wait()  # the last one must be complete before the next begins (one in flight)
    run_dir = trainer._get_output_dir(trial=trial)
    step = trainer.state.global_step
    output_dir = os.path.join(run_dir, f"checkpoint-{step}")
    trainer.store_flos()
    trainer.state.best_model_checkpoint = best_checkpoint(trainer, run_dir, step) or trainer.state.best_model_checkpoint
    model_only = trainer.args.save_only_model  # no optimizer, scheduler, scaler or RNG files (transformers' save)
    if not trainer.args.should_save:
        if not model_only:
            trainer._save_rng_state(output_dir)  # the other ranks' own RNG files, at once as the Trainer writes them
        return
    rng, rng_file = rng_states(trainer), os.path.join(output_dir, rng_file_name(trainer))
    scheduler = copy.deepcopy(trainer.lr_scheduler.state_dict())
    scaler = getattr(trainer.accelerator, "scaler", None)  # fp16's loss scale: a resume without it starts over
    scaler = copy.deepcopy(scaler.state_dict()) if scaler is not None else None
    for cb in [cb for cb in trainer.callback_handler.callbacks + [trainer.control] if isinstance(cb, ExportableState)]:
        name, state = type(cb).__name__, cb.state()
        if isinstance(trainer.state.stateful_callbacks.get(name), list):
            trainer.state.stateful_callbacks[name].append(state)
        else:
            trainer.state.stateful_callbacks[name] = state
    trainer_state = trainer_state_copy(trainer.state)
    buffers = writer.buffers
    # Which tensors, and the optimizer's groups (learning rates included: an evaluation may step a plateau
    # scheduler before the next optimizer step), fixed now; their contents copied in the background.
    weights = saved_state(trainer.model, buffers.get("weights"))
    optimizer = None if model_only else trainer.optimizer.state_dict()
    writer.hold = hold = CopyBeforeStep(trainer.optimizer)
    in_loop = time.monotonic() - started
    limit, best = trainer.args.save_total_limit, trainer.state.best_model_checkpoint

    def take_copy() -> None:
        buffers["weights"] = snapshot(weights, buffers.get("weights"))
        if optimizer is not None:
            buffers["optimizer"] = snapshot(optimizer, buffers.get("optimizer"))

    def write() -> None:
        os.makedirs(output_dir, exist_ok=True)
        trainer._save(output_dir, state_dict=buffers["weights"])
        if not model_only:
            torch.save(rng, rng_file)
            torch.save(buffers["optimizer"], os.path.join(output_dir, OPTIMIZER_NAME))
            torch.save(scheduler, os.path.join(output_dir, SCHEDULER_NAME))
            if scaler is not None:
                torch.save(scaler, os.path.join(output_dir, SCALER_NAME))
        trainer_state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))
        marked.complete(step, Path(output_dir), stall=in_loop + hold.stall(), save=time.monotonic() - started)
        rotate_checkpoints(output_dir=run_dir, save_total_limit=limit, best_model_checkpoint=best)

    writer.submit(str(step), write, copy=take_copy)
