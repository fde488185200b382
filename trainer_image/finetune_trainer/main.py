"""The trainer: setup -> data -> model -> train -> save, each a small function; the exit code tells the operator
what happened (finetune_operator.api.exit_codes). Started by torchrun, once per process.
"""

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes
from finetune_operator.api.elastic import restarts_in_place
from finetune_trainer import objectstore
from finetune_trainer.config import TrainerConfig, load_config, training_arguments
from finetune_trainer.errors import (
    EARLY_STOPS,
    ConfigError,
    Interrupted,
    LossDiverged,
    NoGPUVisible,
    StopRequested,
    TrainerError,
    outcome,
    stop_cause,
)
from finetune_trainer.outputs import checkpoints
from finetune_trainer.outputs.final_model import save_final
from finetune_trainer.outputs.summary import (
    early_stopping,
    grpo_summary,
    loss_plot,
    peak_memory,
    preference_summary,
    sharding,
)
from finetune_trainer.training import advice, safe_loading, workers
from finetune_trainer.training.model import base_model
from finetune_trainer.training.resume import resume_checkpoint
from finetune_trainer.training.trainer import build_trainer
from finetune_trainer.unused_libraries import leave_out, unused_libraries

log = logging.getLogger("finetune_trainer")
SUMMARY_FILE = "summary.json"  # the run's summary beside the model in output.uri


def setup(cfg: TrainerConfig):
    """TrainingArguments for the config. Building them loads torch and transformers and initialises
    torch.distributed."""
    leave_out(unused_libraries(cfg.spec))  # before transformers is imported: it looks for them at once
    require_gpus(cfg.spec.distributed.gpus_per_node)
    if cfg.spec.distributed.gpus_per_node == 0 and cfg.spec.distributed.deepspeed is not None:
        os.environ.setdefault(c.ENV_DS_ACCELERATOR, "cpu")
    args = training_arguments(cfg)
    if args.use_cpu and args.fsdp:
        raise ConfigError("FSDP through the Trainer needs GPUs; on CPU it silently runs as DDP")
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    return args


def require_gpus(gpus_per_node: int) -> None:
    """A GPU job that sees no GPU says why before TrainingArguments does (its "bf16/gpu ... use_cpu" names no field
    of ours): a torch without CUDA is the image's fault (permanent); a CUDA torch without a device is the node's
    (driver, device plugin), which another attempt on another node may not share."""
    import torch

    if gpus_per_node == 0 or torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        raise ConfigError(f"spec.distributed.gpusPerNode is {gpus_per_node} but this image's torch "
                          f"{torch.__version__} is a CPU build; use the CUDA trainer image for GPU jobs, or set "
                          "spec.distributed.gpusPerNode: 0")
    raise NoGPUVisible(f"spec.distributed.gpusPerNode is {gpus_per_node} but torch (CUDA {torch.version.cuda}) sees "
                       f"no GPU (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): the node's "
                       "NVIDIA driver or device plugin did not expose one; to train on CPUs set "
                       "spec.distributed.gpusPerNode: 0")


def refusals(cfg: TrainerConfig, main_process: bool):
    """What refuses a job before training, on the main process: the Hub token (spec.output.push), the bucket and the
    prefix's owner record (spec.output.uri; returns the claim, None without a uri)."""
    if cfg.spec.output.push is not None and main_process:
        from finetune_trainer.outputs.hub_access import check_access

        check_access(cfg)
    if not cfg.spec.output.uri:
        return None
    from finetune_trainer.outputs.remote_output import claim_prefix

    return claim_prefix(cfg, main_process)


def run(config_path: str) -> dict[str, Any]:
    predecessor = workers.take_predecessor()  # what the worker before this one on this pod left (in place)
    marks = {"started": workers.started()}
    cfg = load_config(config_path)
    main_process = os.environ.get(c.ENV_RANK, "0") == "0"  # TrainingArguments' process_index 0, checked below
    objectstore.configure(cfg.spec.s3, cfg.model_cache)
    from finetune_trainer.outputs.status_report import StatusReporter, Warnings

    reporter = (StatusReporter.in_cluster(cfg.namespace, cfg.job_name, cfg.job_uid, cfg.attempt)
                if main_process else None)
    # A refused Hub token (PushRefused), a refused or missing bucket (77), a prefix another run writes (78) fail
    # before training. A process on its own checks before torch and transformers load (~5 s of CPU). In a gang,
    # after the process group exists: a failure there ends every rank at once, while a peer waiting to join a group
    # whose rank 0 was refused first waits out its store's timeout (a 2-node local run took 55 s to end, not 13).
    alone = int(os.environ.get(c.ENV_WORLD_SIZE, "1")) == 1
    claimed = refusals(cfg, main_process) if alone else None
    args = setup(cfg)
    if args.process_index != int(os.environ.get(c.ENV_RANK, "0")):  # what main_process stood for above
        raise RuntimeError(f"TrainingArguments' process index {args.process_index} is not RANK "
                           f"{os.environ.get(c.ENV_RANK)}")
    if not alone:
        claimed = refusals(cfg, main_process)
    remote = None
    if claimed is not None:
        from finetune_trainer.outputs.remote_output import RemoteOutput

        remote = RemoteOutput.for_run(cfg, main_process, claimed, reporter)
    # Before the first model, adapter or checkpoint is read: what others can write there is loaded as data only.
    safe_loading.enforce()
    from finetune_trainer.data.preparing import prepare_data
    from finetune_trainer.outputs import tracking
    from finetune_trainer.training.model import (
        add_stop_ids,
        load_model,
        load_tokenizer,
        trainable_parameters,
        trained_stop_ids,
    )

    tokenizer = load_tokenizer(cfg.spec)
    data = prepare_data(cfg, args, tokenizer, reporter)
    warnings = Warnings(reporter, journal=cfg.output_dir / c.NOTICES_FILE if args.process_index == 0 else None)
    advice.folded_system(cfg.spec, data.stats, warnings)
    advice.row_outcomes(cfg.spec, data.stats, warnings)
    # spec.training.seed covers the weights' init too: new rows of a grown vocabulary, LoRA's A matrices.
    from transformers import set_seed

    set_seed(args.seed)
    # Before gigabytes of weights load: what cannot be built, or cannot fit this GPU, fails now (78).
    from finetune_trainer.training.memory_check import check_before_loading

    check_before_loading(cfg.spec, len(tokenizer), warnings)
    model = load_model(cfg.spec, use_cpu=args.use_cpu, vocab_size=len(tokenizer))
    marks["modelLoaded"] = time.time()
    if cfg.spec.method.objective != "reward":  # a reward model does not generate
        # Samples, checkpoints and the final model stop generating where the data taught the model to stop.
        add_stop_ids(base_model(model), trained_stop_ids(cfg.spec, tokenizer))
    trainable, total = trainable_parameters(model)
    trainer, progress, watchdog, stop, samples = build_trainer(cfg, args, tokenizer, model, data, reporter, warnings)
    # The group torchrun formed and what its forming cost (workers.jsonl); told to the operator, which follows the
    # groups of an attempt that restarts in place.
    from finetune_trainer.training.worker_report import WorkerGroupReport

    trainer.add_callback(WorkerGroupReport(cfg.output_dir, reporter if restarts_in_place(cfg.spec) else None,
                                           predecessor, cfg.attempt, marks))
    if remote is not None:  # the bucket's newest complete checkpoint, here before the first step
        remote.restore()
        trainer.add_callback(remote.callback(progress))
        owed = remote.catch_up()
        if owed:
            warnings.note(f"uploading {len(owed)} checkpoint(s) that had not reached {cfg.spec.output.uri}: "
                          f"{', '.join(owed)}")
        for note in remote.notes:  # e.g. a lease on the prefix taken over
            warnings.note(note)
    resume = resume_checkpoint(cfg)
    # What a user knows the checkpoint as: its copy in the bucket with output.uri (the local one is a download).
    source = (remote.bucket_copy(Path(resume)) if remote is not None and resume is not None else None) or resume
    if resume is not None:
        warnings.note(f"resuming from {Path(resume).name} (step {checkpoints.step_of(Path(resume)) or 0}: {source})")
        advice.batch_changed(Path(resume), args, warnings)
        advice.weights_only(Path(resume), args, warnings)
        advice.data_not_skipped(Path(resume), args, warnings)
    runs = tracking.configure(cfg, resuming=resume is not None, rank=args.process_index)
    trainer.add_callback(tracking.TrackerRunRecorder(cfg.output_dir, runs))
    pusher = None
    push = cfg.spec.output.push
    if push is not None and push.strategy == "checkpoint" and trainer.args.should_save:
        from finetune_trainer.outputs.hub import CheckpointPushCallback, CheckpointPusher

        pusher = CheckpointPusher(cfg)
        trainer.add_callback(CheckpointPushCallback(pusher))
    if resume is not None and reporter is not None:  # say what this attempt restored from (kubectl get -o yaml)
        progress.report_restored(checkpoints.step_of(Path(resume)) or 0, resume, source)
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as exc:
        refusal = safe_loading.refusal(exc)
        if resume is not None and refusal is not None:
            raise ConfigError(safe_loading.not_data(source or resume, refusal)) from exc
        raise
    # A run that ended (not one stopped to resume) is judged at its end, however short; with early stopping the
    # final model is the best checkpoint, saved before any spike (none is saved during one), not the last weights.
    best = trainer.args.load_best_model_at_end and trainer.state.best_model_checkpoint
    if stop.requested is None and not best:
        watchdog.judge_end(trainer.state.global_step)
    if watchdog.diverged_at is not None:
        raise LossDiverged(advice.diverged(cfg.output_dir, watchdog))
    if remote is not None and (lost := remote.taken_over()) is not None:  # another run writes the prefix now
        raise lost
    if stop.requested is not None:
        if remote is not None:
            remote.drain()  # the checkpoint of the stop reaches the bucket within the pod's grace period
        if stop.withheld:  # the loss was in a spike: its weights are not kept
            raise Interrupted(f"stopped by {stop_cause(stop.requested)} at step {trainer.state.global_step} with the "
                              f"loss in a spike, so no checkpoint was saved; the next run resumes from the last one "
                              f"before it (step {watchdog.last_good_step})")
        raise Interrupted(f"stopped by {stop_cause(stop.requested)} at step {trainer.state.global_step}; a checkpoint "
                          "was saved and the next run resumes from it")
    streamed = streamed_rows(cfg, warnings)
    paths = save_final(cfg, trainer, tokenizer)
    if trainer.args.should_save:
        paths.update(loss_plot(cfg))
    history = [h for h in trainer.state.log_history if "loss" in h]
    attempt = progress.attempt_totals(trainer.state, result.metrics.get("train_runtime"))
    if resume is not None and attempt["attemptSteps"] == 0:  # e.g. a job created again over a finished run's output
        warnings("ResumedAtFinalStep", f"{resume} is already at the final step ({trainer.state.global_step}): "
                 "nothing was trained, the final model was saved from it. To train again, delete the checkpoints, "
                 "set checkpoints.resume: never, or use another name or output.subPath")
    evaluations = [h for h in trainer.state.log_history if "eval_loss" in h]
    summary = {
        "reason": exit_codes.reason(exit_codes.SUCCESS), "steps": trainer.state.global_step,
        "resumedFrom": source, "finalLoss": history[-1]["loss"] if history else None,
        "trainLoss": result.training_loss if attempt["attemptSteps"] > 0 else None,
        "evalLoss": evaluations[-1]["eval_loss"] if evaluations else None,
        "evalPerplexity": evaluations[-1].get("eval_perplexity") if evaluations else None,
        **preference_summary(trainer.state.log_history), **grpo_summary(cfg, trainer),
        **early_stopping(cfg, trainer),
        **({"adapterInitFrom": cfg.spec.method.lora.init_from} if cfg.spec.method.lora.init_from else {}),
        **({"samples": [{**r, "completion": r["completion"][:500]} for r in samples.last]}
           if samples is not None else {}),
        "trainRuntimeSeconds": result.metrics.get("train_runtime"), **attempt,
        "tokensSeen": trainer.state.num_input_tokens_seen, "trainableParameters": trainable,
        "totalParameters": total, "worldSize": args.world_size,
        "distributedType": str(trainer.accelerator.distributed_type),
        "modelWrapper": type(trainer.model_wrapped).__name__, **sharding(trainer), **peak_memory(),
        "data": {**data.stats, **streamed}, **paths, **({"trackerRuns": runs} if runs else {}),
        **({"warnings": warnings.said} if warnings.said else {}),
    }
    if pusher is not None:
        pusher.wait()
        summary.update(checkpointPushes=pusher.pushed, **({"checkpointPushFailures": pusher.failures}
                                                           if pusher.failures else {}))
    if cfg.spec.output.push is not None and trainer.args.should_save:
        from finetune_trainer.outputs.hub import push_final

        summary.update(push_final(cfg, paths, summary))
        if reporter is not None:
            reporter.report({"pushed": summary["pushed"]}, force=True)
    if remote is not None:  # the job succeeds only once final/ is in the bucket
        (cfg.output_dir / SUMMARY_FILE).write_text(json.dumps(summary, default=str))
        names = [n for n in ("final", "merged", "loss.png", c.PROGRESS_FILE, SUMMARY_FILE)
                 if (cfg.output_dir / n).exists()]
        from finetune_trainer.outputs.remote_output import FINISH_WAIT_SECONDS

        behind = remote.behind()
        if behind is not None:  # say why the run is not done yet, and for how long it may wait
            warnings.note(f"training is done; waiting up to {FINISH_WAIT_SECONDS / 60:.0f} min for {behind} before "
                          f"uploading the final model to {cfg.spec.output.uri}")
        try:
            summary["uploaded"] = remote.finish(names, warnings.note, stopped=lambda: stop.requested)
        except TrainerError as exc:  # the local summary must not say Succeeded for a run that exits 74 or 77
            failed = {**summary, "reason": getattr(exc, "reason", None) or exit_codes.reason(exc.exit_code),
                      "message": str(exc)}
            (cfg.output_dir / SUMMARY_FILE).write_text(json.dumps(failed, default=str))
            raise
    return summary


def streamed_rows(cfg: TrainerConfig, warnings) -> dict[str, Any]:
    """data.streaming: the rows were tokenized while training ran, so what was cut or dropped is known only now:
    summed over every process (a collective: every rank gets here), said, and kept for the summary."""
    if not cfg.spec.data.streaming or cfg.spec.method.objective != "sft":
        return {}
    from finetune_trainer.data.streaming import add, streamed_stats

    counts = [streamed_stats()]
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, streamed_stats())
    total: dict[str, Any] = {}
    for rank in counts:
        for split, stats in (rank or {}).items():
            add(total.setdefault(split, {}), stats)
    advice.folded_system(cfg.spec, total, warnings)
    advice.row_outcomes(cfg.spec, total, warnings, streamed=True)
    return {"streamed": total}


def write_result(code: int, summary: dict[str, Any]) -> None:
    """Each process leaves its result where the launcher aggregates it into the pod's termination message."""
    directory = os.environ.get(c.ENV_RESULT_DIR)
    if not directory:
        return
    rank = os.environ.get(c.ENV_LOCAL_RANK, "0")
    result = {"exitCode": code, **summary}
    result.update(workers.result_fields(result))
    Path(directory, f"result-{rank}.json").write_text(json.dumps(result, default=str))


def release_process_group() -> None:
    """Destroys torch.distributed's process group while the interpreter is whole. Left to the exit, a worker thread
    of a gloo group may drop the last reference to a finished collective's tensor while Python finalizes: the GIL
    that release needs is gone, the thread is torn down inside a C++ destructor, and a run that succeeded dies of
    SIGABRT ("terminate called without an active exception"). Local: no collective, so a rank that failed alone
    does not wait for the others."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    try:
        dist.destroy_process_group()
    except Exception as exc:  # the outcome is already written; the exit must still happen
        log.warning("could not destroy the process group before exiting: %s", exc)


def _stop_before_training(signum: int, _frame: Any) -> None:
    """A stop while loading or tokenizing: nothing to save yet, so stop at once (exit 143, resumable), without a
    traceback; a cached tokenization is written atomically, so a half one is never reused. The signal is also
    recorded: should the exception still be lost, GracefulStop stops the gang at its first step end."""
    EARLY_STOPS.append(signum)
    raise StopRequested(f"stopped by {stop_cause(signum)} before training started; nothing to save yet")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # bitsandbytes warns at import, on every CPU with AVX512-BF16, that it has no Hub kernel for 4-bit CPU matmuls
    # (the `kernels` package is absent on purpose: it would download code at run time). No job of ours runs 4-bit
    # on CPU (validation refuses it), so the line is noise in every pod's log.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    for sig in (signal.SIGTERM, signal.SIGINT):  # GracefulStop takes over once training runs
        signal.signal(sig, _stop_before_training)
    code, summary, unexpected = outcome(lambda: run(args.config))
    if unexpected is not None:
        log.error("training failed", exc_info=unexpected)
    elif code == exit_codes.INTERRUPTED:  # a requested stop that went as asked: not an error in every pod's log
        log.info("%s: %s", summary["reason"], summary["message"])
    elif code != exit_codes.SUCCESS:
        log.error("%s: %s", summary["reason"], summary["message"])
    write_result(code, summary)
    if unexpected is not None and os.environ.get(c.ENV_PET_RDZV_BACKEND) == c.RDZV_BACKEND_C10D:
        # A worker of a group that restarts in place: its failure is logged and its result written; the group
        # re-forms as soon as it is gone, and the interpreter's teardown (a process group with a vanished peer,
        # trackers) takes seconds. Nothing is lost: no checkpoint is being written (train() waited for it). The
        # prefix's owner record is released first, as every other exit releases it.
        owner = sys.modules.get("finetune_trainer.outputs.owner")
        if owner is not None:
            owner.release_held()
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    release_process_group()
    if unexpected is not None:
        raise unexpected
    if code == exit_codes.SUCCESS and os.environ.get(c.ENV_RANK, "0") == "0":
        print("FINETUNE_SUMMARY " + json.dumps(summary, default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
