"""The trainer: setup -> data -> model -> train -> save, each a small function; the exit code tells the operator
what happened (finetune_operator.api.exit_codes). Started by torchrun, once per process.
"""

import argparse
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes
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
from finetune_trainer.training import advice

log = logging.getLogger("finetune_trainer")
SUMMARY_FILE = "summary.json"  # the run's summary beside the model in output.uri


def setup(config_path: str):
    """Config -> (TrainerConfig, TrainingArguments). Building the arguments also initialises torch.distributed."""
    cfg = load_config(config_path)
    require_gpus(cfg.spec.distributed.gpus_per_node)
    if cfg.spec.distributed.gpus_per_node == 0 and cfg.spec.distributed.deepspeed is not None:
        os.environ.setdefault(c.ENV_DS_ACCELERATOR, "cpu")
    args = training_arguments(cfg)
    if args.use_cpu and args.fsdp:
        raise ConfigError("FSDP through the Trainer needs GPUs; on CPU it silently runs as DDP")
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    return cfg, args


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


def prepare_data(cfg: TrainerConfig, args, tokenizer, reporter):
    from finetune_trainer.data import prepare
    from finetune_trainer.data.preparing import PreparingHeartbeat, rank_zero_first

    if cfg.spec.method.objective != "sft":  # pairs, checked here and tokenized by TRL's trainer
        from finetune_trainer.data.preference import prepare_preference

        return prepare_preference(cfg.spec.data, tokenizer, args.seed)
    if cfg.spec.data.streaming:
        from finetune_trainer.data.streaming import prepare_streaming

        return prepare_streaming(cfg.spec.data, tokenizer, args.seed)

    # Rank 0 tokenizes and caches, reporting a heartbeat; the others wait, then load the cache instead of
    # tokenizing inside a collective.
    cache = cfg.cache / "tokenized"
    with rank_zero_first(args.process_index, args.world_size):
        if args.process_index != 0:
            return prepare(cfg.spec.data, tokenizer, cache, args.seed)
        with PreparingHeartbeat(cfg.output_dir, reporter) as heartbeat:
            return prepare(cfg.spec.data, tokenizer, cache, args.seed, on_progress=heartbeat.update)


def resume_checkpoint(cfg: TrainerConfig) -> str | None:
    """auto: the newest complete checkpoint in the output dir (partial ones skipped), else the operator's hint
    (status.checkpoint) if it still verifies; never: start fresh; a path the user gave: that one or an error."""
    resume = cfg.spec.checkpoints.resume
    if resume == "never":
        return None
    if resume == "auto":
        found = checkpoints.newest_complete(cfg.output_dir)
        if found is not None:
            _compatible(found, cfg, data_too=True)
            return str(found)
        if cfg.resume_from and not cfg.resume_from.startswith("s3://"):  # a bucket's was restored above
            try:
                checkpoints.verify(Path(cfg.resume_from))
                return cfg.resume_from
            except checkpoints.IncompleteCheckpoint as exc:
                log.warning("ignoring the operator's resume hint: %s", exc)
        return None
    try:
        checkpoints.verify(Path(resume))
    except checkpoints.IncompleteCheckpoint as exc:
        raise ConfigError(f"checkpoints.resume points at an unusable checkpoint: {exc}") from exc
    _compatible(Path(resume), cfg, data_too=False)  # a checkpoint named on purpose may continue on new data
    return resume


def _compatible(checkpoint: Path, cfg: TrainerConfig, data_too: bool) -> None:
    """A FineTuneJob deleted and created again under its name (or an edited output path) finds checkpoints another
    model or method produced: resuming would crash on shapes, or silently train the wrong thing. Permanent. Other
    data is refused too when resuming automatically (the trainer would skip batches of data it never saw); a
    checkpoint named in checkpoints.resume may continue on new data."""
    why = checkpoints.incompatibility(checkpoint, cfg.spec, keys=checkpoints.MODEL_KEYS)
    if why is not None:
        raise ConfigError(f"the checkpoint {checkpoint} was produced by another model or method ({why}); it is "
                          "not resumed. Delete the output directory's checkpoints, set checkpoints.resume: never, "
                          "or give the job another name or output.subPath")
    other_data = checkpoints.incompatibility(checkpoint, cfg.spec, keys=checkpoints.DATA_KEYS) if data_too else None
    if other_data is not None:
        raise ConfigError(f"the checkpoint {checkpoint} was trained on other data (spec.data changed: {other_data}); "
                          "resume: auto does not continue it, as it would skip batches of data it never saw. "
                          f"Name it in checkpoints.resume ({checkpoint}) to continue on the new data, set "
                          "checkpoints.resume: never, or give the job another name or output.subPath")


def build_trainer(cfg: TrainerConfig, args, tokenizer, model, data, reporter, warnings):
    from transformers import Trainer

    from finetune_trainer.data.collators import make_collator
    from finetune_trainer.training.callbacks import (
        CheckpointMarkerCallback,
        DivergenceWatch,
        GracefulStop,
        ProgressCallback,
    )
    progress = ProgressCallback(cfg.output_dir, reporter, cfg.spec.training.precision,
                                cfg.spec.resources.peak_tflops_per_gpu, attempt=cfg.attempt)
    watchdog = DivergenceWatch(cfg.spec.run_policy.divergence, warnings, _vocab_size(model))
    # The marker callback runs first so the progress record of a save already names the new checkpoint.
    stop = GracefulStop()
    producer = {**checkpoints.provenance(cfg.spec), **advice.topology(args)}
    # With output.uri, status.checkpoint names a checkpoint once it is complete in the bucket (remote_output).
    marked = CheckpointMarkerCallback(cfg.output_dir, None if cfg.spec.output.uri else progress, producer)
    callbacks = [marked, progress, watchdog, stop]
    early = cfg.spec.evaluation.early_stopping
    if early is not None:
        from transformers import EarlyStoppingCallback

        callbacks.append(EarlyStoppingCallback(early.patience, early.threshold))

    evaluation = cfg.spec.evaluation
    samples = None
    if evaluation.prompts:
        from finetune_trainer.training.samples import SampleCallback

        samples = SampleCallback(list(evaluation.prompts), evaluation.generation, cfg.spec.data, tokenizer,
                                 cfg.output_dir, cfg.spec.distributed.shards_parameters, stop)
        callbacks.append(samples)

    base: Any = Trainer
    kwargs: dict[str, Any] = {"data_collator": make_collator(tokenizer, cfg.spec.data.packing,
                                                             cfg.spec.model.attn_implementation)}
    if cfg.spec.method.objective == "dpo":
        # TRL's DPOTrainer, with our callbacks, checkpoints and exit codes. A LoRA model needs no second copy: the
        # reference is the base with the adapter disabled; a full fine-tune gets TRL's frozen copy (or none with
        # precomputeRefLogProbs).
        from trl import DPOTrainer

        base, kwargs = DPOTrainer, {}

    class FineTuneTrainer(base):
        def log(self, logs: dict[str, float], *rest, **kwargs) -> None:
            # Perplexity next to every validation loss: in TensorBoard, progress.jsonl, the status and the summary.
            if "eval_loss" in logs:
                logs["eval_perplexity"] = perplexity(logs["eval_loss"])
            super().log(logs, *rest, **kwargs)

        def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
            # transformers trains one step past max_steps when it resumes a checkpoint saved at max_steps in mid-epoch
            # (its skip-ahead runs a step before any stop check): an attempt that resumes a finished run, e.g. to
            # retry its push, would train on and overwrite the model.
            if 0 < self.state.max_steps <= self.state.global_step:
                self.control.should_training_stop = True
                return
            super()._run_epoch(*args, **kwargs)

    trainer = FineTuneTrainer(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval,
                              processing_class=tokenizer, callbacks=callbacks, **kwargs)
    if samples is not None:
        samples.tensorboard = next((cb for cb in trainer.callback_handler.callbacks
                                    if type(cb).__name__ == "TensorBoardCallback"), None)
    return trainer, progress, watchdog, stop, samples


def _vocab_size(model) -> int | None:
    """The output vocabulary, whose uniform guess (ln V) bounds the divergence guard's early loss."""
    size = getattr(_base_model(model).config, "vocab_size", None)
    return size if isinstance(size, int) else None


def perplexity(loss: float) -> float:
    """exp(mean token cross-entropy); inf rather than an overflow for a diverged loss."""
    return math.exp(loss) if loss < 700 else math.inf


def save_final(cfg: TrainerConfig, trainer, tokenizer) -> dict[str, str]:
    """The final model (adapter for LoRA) under final/, plus merged/ when asked; weights verified non-empty; the
    generation config stops where the data taught the model to stop."""
    final = cfg.output_dir / "final"
    # Inference wants the KV cache (training turned it off): the saved config must not say use_cache: false.
    trainer.model.config.use_cache = True
    base = _base_model(trainer.model)
    trainer.save_model(str(final))  # gathers ZeRO-3 / FSDP weights (16-bit gather is set in the presets)
    paths = {"model": str(final)}
    if trainer.args.should_save:
        tokenizer.save_pretrained(final)
        if getattr(base, "generation_config", None) is not None:  # an adapter's directory has none of its own:
            base.generation_config.save_pretrained(final)  # the base's, with the trained stops (run())
        files = checkpoints.weight_files(final)
        if not files or any(f.stat().st_size == 0 for f in files):
            raise TrainerError(f"the final model in {final} has no or empty weights")
        if cfg.spec.output.merge_adapter and cfg.spec.method.type in ("lora", "qlora"):
            paths["merged"] = str(merge_adapter(cfg, final, tokenizer))
    trainer.accelerator.wait_for_everyone()
    return paths


def _base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def merge_adapter(cfg: TrainerConfig, adapter_dir: Path, tokenizer) -> Path:
    """Reloads base + adapter from disk on CPU and merges: works the same whatever sharding trained them."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    m = cfg.spec.model
    from finetune_trainer.training.model import source

    name = source(m.name)
    base = AutoModelForCausalLM.from_pretrained(name, revision=m.revision if name == m.name else None,
                                                trust_remote_code=m.trust_remote_code, dtype="auto")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    target = cfg.output_dir / "merged"
    merged.config.use_cache = True
    from finetune_trainer.training.model import add_stop_ids, trained_stop_ids

    add_stop_ids(merged, trained_stop_ids(cfg.spec, tokenizer))
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)  # merged/ is a whole model: AutoTokenizer must load from it too
    return target


def run(config_path: str) -> dict[str, Any]:
    from finetune_trainer.outputs import tracking
    from finetune_trainer.training.model import (
        add_stop_ids,
        load_model,
        load_tokenizer,
        trainable_parameters,
        trained_stop_ids,
    )

    cfg, args = setup(config_path)
    objectstore.configure(cfg.spec.s3, cfg.cache)
    if cfg.spec.output.push is not None and args.should_save:  # a refused token fails now, not after the run
        from finetune_trainer.outputs.hub import check_access

        check_access(cfg)
    from finetune_trainer.outputs.status_report import StatusReporter, Warnings

    reporter = (StatusReporter.in_cluster(cfg.namespace, cfg.job_name, cfg.job_uid, cfg.attempt)
                if args.process_index == 0 else None)
    remote = None
    if cfg.spec.output.uri:  # a missing bucket or refused credentials fail now (77), not after training
        from finetune_trainer.outputs.remote_output import RemoteOutput

        remote = RemoteOutput(cfg.spec.output.uri, cfg.output_dir, cfg.spec.distributed.num_nodes,
                              cfg.spec.checkpoints.keep, args.process_index == 0, reporter)
        remote.check()
    tokenizer = load_tokenizer(cfg.spec)
    data = prepare_data(cfg, args, tokenizer, reporter)
    warnings = Warnings(reporter, journal=cfg.output_dir / c.NOTICES_FILE if args.process_index == 0 else None)
    advice.folded_system(cfg.spec, data.stats, warnings)
    advice.truncated(cfg.spec, data.stats, warnings)
    # spec.training.seed covers the weights' init too: new rows of a grown vocabulary, LoRA's A matrices.
    from transformers import set_seed

    set_seed(args.seed)
    model = load_model(cfg.spec, use_cpu=args.use_cpu, vocab_size=len(tokenizer))
    # Samples, checkpoints and the final model stop generating where the data taught the model to stop.
    add_stop_ids(_base_model(model), trained_stop_ids(cfg.spec, tokenizer))
    trainable, total = trainable_parameters(model)
    trainer, progress, watchdog, stop, samples = build_trainer(cfg, args, tokenizer, model, data, reporter, warnings)
    if remote is not None:  # the bucket's newest complete checkpoint, here before the first step
        remote.restore()
        trainer.add_callback(remote.callback(progress))
        owed = remote.catch_up()
        if owed:
            warnings.note(f"uploading {len(owed)} checkpoint(s) that had not reached {cfg.spec.output.uri}: "
                          f"{', '.join(owed)}")
    resume = resume_checkpoint(cfg)
    # What a user knows the checkpoint as: its copy in the bucket with output.uri (the local one is a download).
    source = (remote.bucket_copy(Path(resume)) if remote is not None and resume is not None else None) or resume
    if resume is not None:
        warnings.note(f"resuming from {Path(resume).name} (step {checkpoints.step_of(Path(resume)) or 0}: {source})")
        advice.batch_changed(Path(resume), args, warnings)
    runs = tracking.configure(cfg, resuming=resume is not None, rank=args.process_index)
    trainer.add_callback(tracking.TrackerRunRecorder(cfg.output_dir, runs))
    pusher = None
    push = cfg.spec.output.push
    if push is not None and push.strategy == "checkpoint" and trainer.args.should_save:
        from finetune_trainer.outputs.hub import CheckpointPushCallback, CheckpointPusher

        pusher = CheckpointPusher(cfg)
        trainer.add_callback(CheckpointPushCallback(pusher))
    if resume is not None and reporter is not None:  # say what this attempt restored from (kubectl get -o yaml)
        step = checkpoints.step_of(Path(resume)) or 0
        reporter.report({"checkpoint": {"step": step, "path": resume, "restoredFrom": source}}, force=True)
    result = trainer.train(resume_from_checkpoint=resume)
    if watchdog.diverged_at is not None:
        raise LossDiverged(advice.diverged(cfg.output_dir, watchdog))
    if stop.requested is not None:
        if remote is not None:
            remote.drain()  # the checkpoint of the stop reaches the bucket within the pod's grace period
        raise Interrupted(f"stopped by {stop_cause(stop.requested)} at step {trainer.state.global_step}; a checkpoint "
                          "was saved and the next run resumes from it")
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
        **preference_summary(trainer.state.log_history),
        **early_stopping(cfg, trainer),
        **({"adapterInitFrom": cfg.spec.method.lora.init_from} if cfg.spec.method.lora.init_from else {}),
        **({"samples": [{**r, "completion": r["completion"][:500]} for r in samples.last]}
           if samples is not None else {}),
        "trainRuntimeSeconds": result.metrics.get("train_runtime"), **attempt,
        "tokensSeen": trainer.state.num_input_tokens_seen, "trainableParameters": trainable,
        "totalParameters": total, "worldSize": args.world_size,
        "distributedType": str(trainer.accelerator.distributed_type),
        "modelWrapper": type(trainer.model_wrapped).__name__, **sharding(trainer), **peak_memory(),
        "data": data.stats, **paths, **({"trackerRuns": runs} if runs else {}),
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
            summary["uploaded"] = remote.finish(names, warnings.note)
        except TrainerError as exc:  # the local summary must not say Succeeded for a run that exits 74 or 77
            failed = {**summary, "reason": getattr(exc, "reason", None) or exit_codes.reason(exc.exit_code),
                      "message": str(exc)}
            (cfg.output_dir / SUMMARY_FILE).write_text(json.dumps(failed, default=str))
            raise
    return summary


def preference_summary(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """The last logged rewards of a preference objective (dpo), as the summary names them; {} for sft."""
    from finetune_trainer.training.callbacks import REWARD_LOGS

    last = next((h for h in reversed(log_history) if "rewards/margins" in h), None)
    return {} if last is None else {name: last[key] for key, name in REWARD_LOGS.items() if key in last}


def loss_plot(cfg: TrainerConfig) -> dict[str, str]:
    """loss.png in the output directory, from progress.jsonl; a plot that cannot be drawn never fails a run."""
    from finetune_trainer.outputs.plot import read_progress, write_loss_plot

    try:
        title = f"{cfg.job_name}: {cfg.spec.model.name} ({cfg.spec.method.type})"
        path = write_loss_plot(read_progress(cfg.output_dir / c.PROGRESS_FILE), cfg.output_dir / "loss.png", title)
    except (OSError, ValueError, ImportError) as exc:  # ImportError: an image without matplotlib
        log.warning("loss.png not written: %s", exc)
        return {}
    return {"lossPlot": str(path)} if path is not None else {}


def early_stopping(cfg: TrainerConfig, trainer) -> dict[str, Any]:
    """Whether early stopping ended the run and which checkpoint became the final model."""
    if cfg.spec.evaluation.early_stopping is None:
        return {}
    state = trainer.state
    return {"stoppedEarly": state.global_step < state.max_steps, "bestCheckpoint": state.best_model_checkpoint,
            "bestEvalLoss": state.best_metric}


def peak_memory() -> dict[str, float]:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"peakMemoryGiB": torch.cuda.max_memory_allocated() / 2**30}


def sharding(trainer) -> dict[str, Any]:
    """What really ran: the ZeRO stage and, under ZeRO-3, the fraction of parameters this rank holds."""
    engine = trainer.model_wrapped
    if not hasattr(engine, "zero_optimization_stage"):
        return {}
    out: dict[str, Any] = {"zeroStage": engine.zero_optimization_stage()}
    params = [p for p in trainer.model.parameters() if hasattr(p, "ds_numel")]
    if params:
        out["localParameterFraction"] = sum(p.ds_tensor.numel() for p in params) / sum(p.ds_numel for p in params)
    return out


def write_result(code: int, summary: dict[str, Any]) -> None:
    """Each process leaves its result where the launcher aggregates it into the pod's termination message."""
    directory = os.environ.get(c.ENV_RESULT_DIR)
    if not directory:
        return
    rank = os.environ.get(c.ENV_LOCAL_RANK, "0")
    Path(directory, f"result-{rank}.json").write_text(json.dumps({"exitCode": code, **summary}, default=str))


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
    if unexpected is not None:
        raise unexpected
    if code == exit_codes.SUCCESS and os.environ.get(c.ENV_RANK, "0") == "0":
        print("FINETUNE_SUMMARY " + json.dumps(summary, default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
