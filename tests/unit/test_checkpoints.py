"""Checkpoint integrity: markers only on verified checkpoints; resume skips partial ones."""

import json
from pathlib import Path

import pytest

from finetune_trainer.outputs import checkpoints as C


def make_checkpoint(root, step, *, weights=b"w" * 64, state=True, marker=True):
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
    if state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if marker:
        C.mark_complete(d)
    return d


def test_mark_complete_writes_a_summary(tmp_path):
    d = make_checkpoint(tmp_path, 10)
    summary = json.loads((d / C.COMPLETE_MARKER).read_text())
    assert summary["step"] == 10 and summary["bytes"] == 64 and summary["weightFiles"] == 1
    written = [p for p in d.rglob("*") if p.is_file() and p.name != C.COMPLETE_MARKER]
    assert summary["files"] == len(written) > 1  # every file of the checkpoint, not only its weights
    assert not list(d.glob(".*tmp"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"weights": None}, "no weight files"),
    ({"weights": b""}, "empty weight files"),
    ({"state": False}, "trainer_state.json unreadable"),
], ids=["no-weights", "empty-weights", "no-state"])
def test_incomplete_checkpoints_are_refused(tmp_path, kwargs, message):
    with pytest.raises(C.IncompleteCheckpoint, match=message):
        make_checkpoint(tmp_path, 5, **kwargs)


def test_newest_complete_skips_partial_and_unmarked(tmp_path):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    make_checkpoint(tmp_path, 30, marker=False)  # crashed before the marker
    broken = make_checkpoint(tmp_path, 40)
    (broken / "model.safetensors").write_bytes(b"")  # marker present but weights lost afterwards
    (tmp_path / "checkpoint-x").mkdir()
    assert C.newest_complete(tmp_path) == tmp_path / "checkpoint-20"


def test_no_checkpoint(tmp_path):
    assert C.newest_complete(tmp_path) is None
    assert C.newest_complete(tmp_path / "missing") is None


def test_steps_sort_numerically_not_lexically(tmp_path):
    make_checkpoint(tmp_path, 9)
    make_checkpoint(tmp_path, 100)
    assert C.newest_complete(tmp_path).name == "checkpoint-100"


def trainer_config(tmp_path, resume="auto", hint=None):
    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.config import TrainerConfig

    spec = FineTuneJobSpec.model_validate({"model": {"name": "/m"}, "data": {"format": "text", "train": [
        {"path": "/d"}]}, "checkpoints": {"resume": resume}})
    return TrainerConfig("j", "ns", spec, {}, tmp_path, hint)


def test_newest_complete_checkpoint_beats_the_operators_hint(tmp_path):
    from finetune_trainer.training.resume import resume_checkpoint

    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    assert resume_checkpoint(trainer_config(tmp_path, hint=str(tmp_path / "checkpoint-10"))).endswith("checkpoint-20")


def test_a_stale_hint_is_ignored_not_fatal(tmp_path):
    from finetune_trainer.training.resume import resume_checkpoint

    assert resume_checkpoint(trainer_config(tmp_path / "empty", hint=str(tmp_path / "checkpoint-70"))) is None


def test_an_explicit_user_path_must_verify(tmp_path):
    from finetune_trainer.errors import ConfigError
    from finetune_trainer.training.resume import resume_checkpoint

    with pytest.raises(ConfigError, match="unusable checkpoint"):
        resume_checkpoint(trainer_config(tmp_path, resume=str(tmp_path / "checkpoint-5")))


def test_a_checkpoint_another_method_produced_is_refused_with_the_difference(tmp_path):
    """A FineTuneJob re-created under its name with LoRA r 16 finds the old job's r 8 checkpoint: not resumed
    (it would crash on shapes and burn retries), a permanent InvalidConfig that says what differs and the fix."""
    from types import SimpleNamespace

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.errors import ConfigError
    from finetune_trainer.outputs import checkpoints as ck
    from finetune_trainer.training.resume import resume_checkpoint

    def spec(r):
        return FineTuneJobSpec.model_validate({"model": {"name": "/models/m"}, "method": {"type": "lora",
                                               "lora": {"r": r}}, "data": {"format": "text",
                                                                           "train": [{"inline": [{"text": "x"}]}]}})

    directory = tmp_path / "checkpoint-40"
    directory.mkdir()
    (directory / "adapter_model.safetensors").write_bytes(b"x" * 16)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": 40}))
    ck.mark_complete(directory, ck.provenance(spec(8)))
    assert ck.incompatibility(directory, spec(8)) is None
    cfg = SimpleNamespace(spec=spec(16), output_dir=tmp_path, resume_from=None)
    with pytest.raises(ConfigError, match=r"produced by another model or method \(method: .*\"r\": 8.*\"r\": 16"):
        resume_checkpoint(cfg)
    cfg.spec = spec(8)
    assert resume_checkpoint(cfg) == str(directory)


def test_other_data_is_not_resumed_automatically_but_can_be_named(tmp_path):
    from types import SimpleNamespace

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.errors import ConfigError
    from finetune_trainer.outputs import checkpoints as ck
    from finetune_trainer.training.resume import resume_checkpoint

    def spec(text, resume="auto"):
        return FineTuneJobSpec.model_validate({"model": {"name": "/models/m"}, "checkpoints": {"resume": resume},
                                               "data": {"format": "text", "train": [{"inline": [{"text": text}]}]}})

    directory = tmp_path / "checkpoint-40"
    directory.mkdir()
    (directory / "adapter_model.safetensors").write_bytes(b"x" * 16)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": 40}))
    ck.mark_complete(directory, ck.provenance(spec("old corpus")))
    cfg = SimpleNamespace(spec=spec("new corpus"), output_dir=tmp_path, resume_from=None)
    with pytest.raises(ConfigError, match=r"trained on other data .* Name it in checkpoints.resume"):
        resume_checkpoint(cfg)
    cfg.spec = spec("new corpus", resume=str(directory))  # named on purpose: continues on the new data
    assert resume_checkpoint(cfg) == str(directory)
    cfg.spec = spec("old corpus")
    assert resume_checkpoint(cfg) == str(directory)
    # A marker from before the data was recorded is not held against a job.
    legacy = ck.provenance(spec("old corpus"))
    del legacy["data"]
    ck.mark_complete(directory, legacy)
    cfg.spec = spec("new corpus")
    assert resume_checkpoint(cfg) == str(directory)


def test_the_background_writer_yields_the_cpu_to_training_and_only_its_own_thread_does():
    """An overlapped checkpoint's write shares the cores with the training loop: its thread alone is niced."""
    import os
    import threading

    from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter

    def niceness(tid: int) -> int:  # field 19 of /proc/<pid>/task/<tid>/stat (after the parenthesised name)
        return int(Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    seen = {}
    writer = CheckpointWriter()
    writer.submit("1", lambda: seen.update(writer=niceness(threading.get_native_id())))
    writer.wait()
    assert seen["writer"] == min(19, niceness(threading.get_native_id()) + 10)  # relative: this run may be niced


def test_an_overlapped_save_writes_the_trainer_state_of_its_step_whatever_the_loop_does_next(tmp_path):
    """The trainer state is taken at the save and written by the writer's thread: what the loop does to its own
    state before that write (the next steps' logs, a callback's key added to the last entry, a stateful callback's
    new state, a new best metric) must not reach the checkpoint's trainer_state.json."""
    from transformers.trainer_callback import TrainerState

    from finetune_trainer.outputs.checkpoint_writer import trainer_state_copy

    state = TrainerState(global_step=8, log_history=[{"loss": 2.0, "step": 4}, {"loss": 1.5, "step": 8}],
                         stateful_callbacks={"EarlyStop": {"args": {"patience": 2}, "attributes": {"bad": 0}}},
                         trial_params={"lr": 0.1}, best_metric=1.5)
    state.save_to_json(str(tmp_path / "at-save.json"))
    taken = trainer_state_copy(state)
    state.global_step, state.best_metric = 9, 1.2
    state.log_history[-1]["rebased"] = 3.0
    state.log_history.append({"loss": 1.2, "step": 9})
    state.stateful_callbacks["EarlyStop"]["attributes"]["bad"] = 1
    state.trial_params["lr"] = 0.2
    taken.save_to_json(str(tmp_path / "written.json"))
    assert json.loads((tmp_path / "written.json").read_text()) == json.loads((tmp_path / "at-save.json").read_text())


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_overlapped_copy_holds_the_next_optimizer_step_and_sees_the_weights_before_it(wrapped):
    """The checkpoint's copy runs beside the next step's forward and backward; the optimizer's step, which would
    change what is being copied, waits for it, and that wait is the save's stall. A copy slower than the step's
    start (here: 0.5 s) still holds the weights of the step it was taken at."""
    import threading
    import time

    import torch

    from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter, CopyBeforeStep, snapshot

    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)

    class Wrapper:  # accelerate's AcceleratedOptimizer: steps the torch optimizer it holds
        def __init__(self, inner):
            self.optimizer = inner

    def one_step():
        layer(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    one_step()
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    writer = CheckpointWriter()
    writer.hold = hold = CopyBeforeStep(Wrapper(optimizer) if wrapped else optimizer)
    copied, copy_started = {}, threading.Event()

    def slow_copy():
        copy_started.set()
        time.sleep(0.5)
        copied.update(snapshot(layer.state_dict()))

    writer.submit("1", lambda: None, copy=slow_copy)
    copy_started.wait(5)
    started = time.monotonic()
    one_step()  # its step waits for the copy
    waited = time.monotonic() - started
    writer.wait()
    assert all(torch.equal(copied[k], before[k]) for k in before)  # the weights of the save, not the step's after
    assert not all(torch.equal(layer.state_dict()[k], before[k]) for k in before)  # and the step did run
    assert 0.3 < hold.stall() <= waited
    one_step()  # removed by the loop's wait(): later steps wait for nothing
    assert hold.stall() == pytest.approx(hold.waited)
    assert not optimizer._optimizer_step_pre_hooks


def test_an_overlapped_copy_saves_the_trained_adapter_while_the_next_step_runs_the_reference_one(tiny_model_dir,
                                                                                                   tmp_path,
                                                                                                   monkeypatch):
    """DPO, KTO and GRPO continuing an adapter (method.lora.initFrom) keep a frozen "ref" copy of it, and their next
    step's reference forward runs with it as the active adapter (trl's use_adapter) before the optimizer steps: in
    the window where the overlapped copy runs. The checkpoint must hold the trained adapter, whichever is active
    while it is copied."""
    import threading

    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from trl.trainer.utils import use_adapter

    from finetune_trainer.outputs import checkpoint_writer
    from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter, save_in_background
    from finetune_trainer.training.callbacks import CheckpointMarkerCallback

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config)
    model.add_adapter("ref", config)  # as trl adds it: a frozen copy of where the adapter started
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ref." in name:
                p.copy_(dict(model.named_parameters())[name.replace(".ref.", ".default.")])
            elif ".default." in name:
                p.add_(1.0)  # the trained adapter has moved away from its reference
    model.set_adapter("default")
    trained = {k: v.clone() for k, v in model.state_dict().items() if ".default." in k}
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                                          report_to=[]))
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    trainer.state.global_step = 5
    marked = CheckpointMarkerCallback(tmp_path / "out", None, {}, deferred=True)
    writer = CheckpointWriter()
    copying, in_reference = threading.Event(), threading.Event()

    def meanwhile(*_):  # pins the interleaving: the copy thread reads the model while the loop is in the reference
        if threading.current_thread() is not threading.main_thread() and not copying.is_set():
            copying.set()
            in_reference.wait(10)

    copy = checkpoint_writer.snapshot

    def paused_snapshot(*args, **kwargs):  # the copy thread's first touch of the model, whichever it is
        meanwhile()
        return copy(*args, **kwargs)

    hook = model.register_state_dict_pre_hook(meanwhile)
    monkeypatch.setattr(checkpoint_writer, "snapshot", paused_snapshot)
    save_in_background(trainer, writer, marked, None)
    assert copying.wait(10)
    with use_adapter(model, "ref"):  # the next step's reference forward
        in_reference.set()
        assert writer.hold.copied.wait(10)
    hook.remove()
    writer.wait()
    saved = load_file(str(tmp_path / "out" / "checkpoint-5" / "adapter_model.safetensors"))
    rng = torch.load(tmp_path / "out" / "checkpoint-5" / "rng_state.pth", weights_only=False)  # as the Trainer names it
    assert {"python", "numpy", "cpu"} <= set(rng) and (tmp_path / "out" / "checkpoint-5" / "FINETUNE_COMPLETE").exists()
    wrong = [k for k, v in trained.items() if not torch.equal(saved.get(k.replace(".default", ""), v + 1), v)]
    assert not wrong, f"the checkpoint's adapter is not the trained one at {wrong[:2]}; it holds {sorted(saved)[:2]}"


# Each way transformers comes to track a best checkpoint, with the best first, in the middle, and tied late.
@pytest.mark.parametrize(("tracking", "losses"), [
    ({"metric_for_best_model": "loss"}, (1.0, 2.0, 3.0, 4.0)),
    ({"load_best_model_at_end": True}, (3.0, 2.0, 1.0, 4.0)),
    ({"lr_scheduler_type": "reduce_lr_on_plateau"}, (2.0, 2.0, 1.0, 1.0)),
])
def test_an_overlapped_save_keeps_the_best_checkpoint_as_the_synchronous_one_does(tiny_model_dir, tmp_path, tracking,
                                                                                    losses):
    """Where transformers tracks a best checkpoint (metric_for_best_model, load_best_model_at_end or a plateau
    scheduler, none of which needs early stopping), its save records it in the trainer state (a resume, the
    final model and the summary read it there) and never rotates it out: an overlapped save must too. An evaluation
    before every save."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter, save_in_background
    from finetune_trainer.training.callbacks import CheckpointMarkerCallback

    kept, states = {}, {}
    for overlap in (False, True):
        out = tmp_path / str(overlap)
        args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to=[], save_strategy="steps",
                                 save_steps=2, eval_strategy="steps", eval_steps=2, save_total_limit=1, **tracking)
        trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args,
                          eval_dataset=[{"input_ids": [1, 2]}])  # never read: the evaluations' losses are given
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        writer = CheckpointWriter()
        marked = CheckpointMarkerCallback(out, None, {}, deferred=True)
        for i, loss in enumerate(losses):
            trainer.state.global_step = 2 * (i + 1)
            trainer._determine_best_metric({"eval_loss": loss}, None)  # the evaluation before the save
            if overlap:
                save_in_background(trainer, writer, marked, None)
            else:
                trainer._save_checkpoint(trainer.model, None)
        writer.wait()
        kept[overlap] = sorted(p.name for p in out.glob("checkpoint-*"))
        states[overlap] = [json.loads((out / name / "trainer_state.json").read_text()) for name in kept[overlap]]
        for state in states[overlap]:
            state["best_model_checkpoint"] = Path(state["best_model_checkpoint"] or "").name
    assert kept[True] == kept[False]
    assert states[True] == states[False]


# The Trainer's save writes these by its arguments and mixed precision; an overlapped one must write the same.
@pytest.mark.parametrize("model_only", [False, True])
@pytest.mark.parametrize("loss_scaler", [False, True])
def test_an_overlapped_save_writes_the_files_the_synchronous_one_does(tiny_model_dir, tmp_path, model_only,
                                                                     loss_scaler):
    """save_only_model (extraArgs) leaves out the optimizer, scheduler, scaler and RNG files; fp16 adds the loss
    scaler's state, without which a resume starts its loss scale over. The loss scaler is torch's own, on CPU."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter, save_in_background
    from finetune_trainer.training.callbacks import CheckpointMarkerCallback

    files, scales = {}, {}
    for overlap in (False, True):
        out = tmp_path / str(overlap)
        args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to=[], save_only_model=model_only)
        trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args)
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        if loss_scaler:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
            trainer.accelerator.scaler.scale(torch.tensor(1.0))  # its first step makes its state
            trainer.accelerator.scaler.update(new_scale=512.0)  # moved away from its initial scale
        trainer.state.global_step = 3
        if overlap:
            writer = CheckpointWriter()
            save_in_background(trainer, writer, CheckpointMarkerCallback(out, None, {}, deferred=True), None)
            writer.wait()
        else:
            trainer._save_checkpoint(trainer.model, None)
        saved = out / "checkpoint-3"
        files[overlap] = sorted(p.name for p in saved.iterdir() if p.name != "FINETUNE_COMPLETE")
        scaler_file = saved / "scaler.pt"
        scales[overlap] = torch.load(scaler_file)["scale"] if scaler_file.exists() else None
    assert files[True] == files[False]
    assert scales[True] == scales[False] == (512.0 if loss_scaler and not model_only else None)
    assert ("optimizer.pt" in files[True]) is not model_only


@pytest.mark.parametrize("model_only", [False, True])
def test_resuming_a_weights_only_checkpoint_says_the_optimizer_and_the_schedule_start_over(tiny_model_dir, tmp_path,
                                                                                          model_only):
    """transformers resumes a save_only_model checkpoint with a new optimizer and its learning-rate schedule from
    step 0 (warmup again) at the checkpoint's step, silently; a gang restart resumes such checkpoints on its own."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter, save_in_background
    from finetune_trainer.training import advice
    from finetune_trainer.training.callbacks import CheckpointMarkerCallback

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_only_model=model_only)
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    trainer.state.global_step = 3
    writer = CheckpointWriter()
    save_in_background(trainer, writer, CheckpointMarkerCallback(tmp_path, None, {}, deferred=True), None)
    writer.wait()
    said: list[tuple[str, str]] = []
    advice.weights_only(tmp_path / "checkpoint-3", args, lambda *w: said.append(w))
    assert [reason for reason, _ in said] == (["WeightsOnlyCheckpoint"] if model_only else [])
    if model_only:
        assert "learning-rate schedule" in said[0][1] and "save_only_model" in said[0][1]


def test_a_deepspeed_checkpoint_keeps_its_optimizer_state_in_its_own_folder(tmp_path):
    from types import SimpleNamespace

    from finetune_trainer.training import advice

    (tmp_path / "checkpoint-3" / "global_step3").mkdir(parents=True)  # DeepSpeed's own scheduler: no scheduler.pt
    said: list[tuple[str, str]] = []
    advice.weights_only(tmp_path / "checkpoint-3", SimpleNamespace(lr_scheduler_type="linear"),
                        lambda *w: said.append(w))
    assert said == []


@pytest.mark.parametrize("ignore", [False, True])
def test_resuming_with_ignore_data_skip_says_the_trained_batches_come_again(tmp_path, ignore):
    """extraArgs.ignore_data_skip makes transformers resume without skipping the epoch's batches already trained on:
    a gang restart then trains on them again, silently; the job says so on every resume."""
    from transformers import TrainingArguments

    from finetune_trainer.training import advice

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], ignore_data_skip=ignore)
    (tmp_path / "checkpoint-7").mkdir()
    said: list[tuple[str, str]] = []
    advice.data_not_skipped(tmp_path / "checkpoint-7", args, lambda *w: said.append(w))
    assert [reason for reason, _ in said] == (["DataSkipIgnored"] if ignore else [])
    if ignore:
        assert "step 7" in said[0][1] and "remove ignore_data_skip" in said[0][1]


@pytest.mark.parametrize("where", ["inside", "outside", "climbing out"])
def test_the_operators_resume_hint_is_taken_only_inside_the_jobs_own_output(tmp_path, where):
    """The hint comes from status.checkpoint, which the trainer identity writes: a complete checkpoint elsewhere
    (another team's, on a shared volume) is not this job's to load."""
    from types import SimpleNamespace

    from finetune_operator.api.spec import FineTuneJobSpec
    from finetune_trainer.outputs import checkpoints as ck
    from finetune_trainer.training.resume import resume_checkpoint

    spec = FineTuneJobSpec.model_validate({"model": {"name": "/models/m"}, "data": {
        "format": "text", "train": [{"inline": [{"text": "x"}]}]}})
    output = tmp_path / "output"
    output.mkdir()
    elsewhere = tmp_path / "theirs" / "checkpoint-900"
    elsewhere.mkdir(parents=True)
    (elsewhere / "model.safetensors").write_bytes(b"x" * 16)
    (elsewhere / "trainer_state.json").write_text(json.dumps({"global_step": 900}))
    ck.mark_complete(elsewhere, ck.provenance(spec))
    hint = {"inside": str(elsewhere), "outside": str(elsewhere),
            "climbing out": f"{output}/../theirs/checkpoint-900"}[where]
    cfg = SimpleNamespace(spec=spec, output_dir=tmp_path if where == "inside" else output, resume_from=hint)
    assert resume_checkpoint(cfg) == (hint if where == "inside" else None)
