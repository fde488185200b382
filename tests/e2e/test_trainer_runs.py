"""The exact command the operator renders, run as real processes: one node, or two "nodes" on 127.0.0.1.

Each test asserts what actually ran (world size, accelerate's distributed type, the wrapper, ZeRO sharding), not
just the exit code: a CPU DDP run without use_cpu trains every rank alone and still exits 0.
"""

import json
import math
import shutil

import pytest

from finetune_operator.api import exit_codes
from finetune_trainer.training.throughput import parameter_counts
from tests.builders import make_job
from tests.support.polling import wait_for_run
from tests.support.trainer_run import run_nodes

ROWS = [{"instruction": f"What is {a} plus {b}?", "output": f"{a} plus {b} is {a + b}."}
        for a in range(1, 5) for b in range(1, 5)]


def job(model_dir, **overrides):
    base = {
        "metadata.name": "e2e",
        "spec.model": {"name": str(model_dir), "dtype": "float32"},
        "spec.data": {"format": "alpaca", "maxLength": 64, "train": [{"inline": ROWS}]},
        "spec.method": {"type": "full"},
        "spec.training": {"maxSteps": 8, "learningRate": 0.003, "perDeviceTrainBatchSize": 4, "precision": "fp32",
                          "optim": "adamw_torch", "loggingSteps": 1, "lrScheduler": "constant", "seed": 7},
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 0},
        "spec.checkpoints": {"saveSteps": 4, "keep": 5},
    }
    return make_job({**base, **overrides})


def progress(workdir):
    records = [json.loads(line) for line in (workdir / "output" / "progress.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("phase") != "Preparing"]  # the data preparation's heartbeat


def losses_by_step(workdir):
    return {r["step"]: r["loss"] for r in progress(workdir) if r["loss"] is not None}


def ok(results):
    for r in results:
        assert r.returncode == 0, r.log[-3000:]
    return results


def test_sft_loss_decreases_and_the_model_is_saved(tiny_model_dir, tmp_path):
    (result,) = ok(run_nodes(job(tiny_model_dir, **{"spec.training.maxSteps": 30}), tmp_path))
    losses = losses_by_step(tmp_path)
    assert losses[30] < 0.6 * losses[1], losses
    s = result.summary
    assert (s["exitCode"], s["reason"], s["steps"], s["worldSize"]) == (0, "Succeeded", 30, 1)
    assert s["data"]["train"]["kept"] == len(ROWS)
    final = tmp_path / "output" / "final"
    assert (final / "model.safetensors").stat().st_size > 0 and (final / "tokenizer.json").exists()
    record = progress(tmp_path)[-1]
    # checkpoint: the newest complete one when step 30 was logged (its save follows the log); checkpoint-28 is
    # written in the background (checkpoints.overlap), complete when its write ends, which may come after that log
    assert record["maxSteps"] == 30 and record["tokensPerSecond"] > 0 and record["checkpoint"]["step"] in (24, 28)
    assert "Traceback" not in result.log and "gemm_4bit_forward" not in result.log  # no noise from bitsandbytes


def test_resume_skips_a_partial_checkpoint_and_matches_the_uninterrupted_run(tiny_model_dir, tmp_path):
    ok(run_nodes(job(tiny_model_dir), tmp_path))
    uninterrupted = losses_by_step(tmp_path)
    out = tmp_path / "output"
    # Simulate a crash after step 6: checkpoint-8 and the final model never happened; checkpoint-6 is half-written.
    shutil.rmtree(out / "checkpoint-8")
    shutil.rmtree(out / "final")
    (out / "progress.jsonl").unlink()
    partial = out / "checkpoint-6"
    shutil.copytree(out / "checkpoint-4", partial)
    (partial / "FINETUNE_COMPLETE").unlink()
    (partial / "model.safetensors").write_bytes(b"")
    (result,) = ok(run_nodes(job(tiny_model_dir), tmp_path))
    assert result.summary["resumedFrom"].endswith("checkpoint-4")
    resumed = losses_by_step(tmp_path)
    assert min(resumed) == 5  # no step before the checkpoint was redone
    for step in range(5, 9):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-4), (step, resumed, uninterrupted)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_overlapped_checkpoints_hold_what_synchronous_ones_do(tiny_model_dir, tmp_path, method):
    """Written in the background from a snapshot taken at the save: the same tensors as the Trainer's own save
    (later steps changed nothing in them), each marked complete with its stall."""
    import torch
    from safetensors.torch import load_file

    runs = {}
    for overlap in (True, False):
        ok(run_nodes(job(tiny_model_dir, **{"spec.method": {"type": method}, "spec.checkpoints.overlap": overlap}),
                     tmp_path / str(overlap)))
        runs[overlap] = tmp_path / str(overlap) / "output"
    weights = "model.safetensors" if method == "full" else "adapter_model.safetensors"
    for step in (4, 8):
        ours, theirs = (runs[o] / f"checkpoint-{step}" for o in (True, False))
        assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
        a, b = load_file(ours / weights), load_file(theirs / weights)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        sa, sb = (torch.load(d / "optimizer.pt", weights_only=False)["state"] for d in (ours, theirs))
        assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
        states = [json.loads((d / "trainer_state.json").read_text()) for d in (ours, theirs)]
        for state in states:  # the step's logs as they were at the save, timings aside
            state["log_history"] = [{k: v for k, v in h.items() if not k.endswith(("_runtime", "_per_second"))}
                                    for h in state["log_history"]]
        assert states[0]["global_step"] == step and states[0] == states[1]
        marker = json.loads((ours / "FINETUNE_COMPLETE").read_text())
        assert 0 <= marker["stallSeconds"] <= marker["saveSeconds"], marker


def test_the_best_checkpoint_is_kept_and_loaded_whether_saves_are_overlapped_or_not(tiny_model_dir, tmp_path):
    """Best-model tracking without early stopping (extraArgs; here the best is the highest validation loss, the
    first evaluation's, so that it is not the last checkpoint): the final model is the best checkpoint's and, with
    keep 1, that checkpoint is the one left, as with synchronous saves. The last checkpoint is still being written
    when training ends: the end's loading of the best and removal of the others must wait for it."""
    import torch
    from safetensors.torch import load_file

    for overlap in (True, False):
        doc = job(tiny_model_dir, **{
            "spec.data": {"format": "alpaca", "maxLength": 64, "train": [{"inline": ROWS}],
                          "validation": [{"inline": ROWS[:4]}]},
            "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 4,
            "spec.training.extraArgs": {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss",
                                        "greater_is_better": True},
            "spec.checkpoints": {"saveSteps": 4, "keep": 1, "overlap": overlap}})
        ok(run_nodes(doc, tmp_path / str(overlap)))
    for overlap in (True, False):
        out = tmp_path / str(overlap) / "output"
        assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-4"], overlap
        best, final = (load_file(d / "model.safetensors") for d in (out / "checkpoint-4", out / "final"))
        assert all(torch.equal(best[k], final[k]) for k in best), overlap


def test_lora_adapter_merge_and_reload_give_the_same_outputs(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    (result,) = ok(run_nodes(job(tiny_model_dir, **{
        "spec.method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        "spec.training.learningRate": 0.01, "spec.output.mergeAdapter": True}), tmp_path))
    assert result.summary["trainableParameters"] < result.summary["totalParameters"] / 2
    ids = torch.tensor([[1, 20, 30, 40, 50, 60]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32")
        base_logits = base(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(base, str(tmp_path / "output" / "final")).eval()
        adapted_logits = adapted(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(result.summary["merged"], dtype="float32").eval()
        merged_logits = merged(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, adapted_logits, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-4)  # the adapter learned something
    # merged/ is a whole model a user loads by path: its tokenizer is there, and inference keeps its KV cache.
    from transformers import AutoConfig, AutoTokenizer

    assert AutoTokenizer.from_pretrained(result.summary["merged"]).chat_template
    assert AutoConfig.from_pretrained(result.summary["merged"]).use_cache is True


@pytest.mark.parametrize(("overrides", "code", "reason"), [
    ({"spec.data.columns": {"instruction": "question"}}, exit_codes.DATA_ERROR, "DataError"),
    ({"spec.model.name": "/nonexistent/model"}, exit_codes.CONFIG_ERROR, "InvalidConfig"),
], ids=["data-error", "config-error"])
def test_exit_code_contract(tiny_model_dir, tmp_path, overrides, code, reason):
    (result,) = run_nodes(job(tiny_model_dir, **overrides), tmp_path)
    assert result.returncode == code, result.log[-2000:]
    assert result.summary["exitCode"] == code and result.summary["reason"] == reason
    assert result.summary["message"]


def test_nan_loss_stops_the_run_with_diverged(tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    weights = load_file(broken / "model.safetensors")
    weights["lm_head.weight"][0, 0] = float("inf")  # inf logits -> NaN loss at the first step
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    (result,) = run_nodes(job(broken), tmp_path / "run")
    assert result.returncode == exit_codes.DIVERGED, result.log[-2000:]
    assert result.summary["reason"] == "LossDiverged" and "at step" in result.summary["message"]
    assert not list((tmp_path / "run" / "output").glob("checkpoint-*"))  # diverged weights never saved
    assert torch.isinf(weights["lm_head.weight"]).any()


@pytest.mark.parametrize(("distributed", "expected"), [
    ({"strategy": "ddp"}, {"distributedType": "DistributedType.MULTI_CPU", "modelWrapper": "DistributedDataParallel"}),
    ({"strategy": "deepspeed", "deepspeed": {"zeroStage": 2}},
     {"distributedType": "DistributedType.DEEPSPEED", "modelWrapper": "DeepSpeedEngine", "zeroStage": 2}),
    ({"strategy": "deepspeed", "deepspeed": {
        "zeroStage": 3, "config": {"zero_optimization": {"stage3_param_persistence_threshold": 0}}}},
     {"distributedType": "DistributedType.DEEPSPEED", "modelWrapper": "DeepSpeedEngine", "zeroStage": 3,
      "localParameterFraction": 0.5}),
], ids=["ddp", "zero2", "zero3"])
def test_two_nodes(tiny_model_dir, tmp_path, distributed, expected):
    # A configured peak (1 GFLOP/s per process) makes MFU appear on CPU, so its wiring is checked end to end.
    # DDP with gradient checkpointing (non-reentrant, as the trainer config asks): the pairing users run.
    doc = job(tiny_model_dir, **{"spec.distributed": {"numNodes": 2, "gpusPerNode": 0, **distributed},
                                 "spec.training.maxSteps": 4, "spec.checkpoints.saveSteps": 2,
                                 "spec.training.gradientCheckpointing": distributed["strategy"] == "ddp",
                                 "spec.resources.peakTflopsPerGpu": 0.001})
    results = ok(run_nodes(doc, tmp_path))
    for r in results:
        assert r.summary["worldSize"] == 2
        assert {k: r.summary.get(k) for k in expected} == expected
    assert results[0].summary["steps"] == 4
    from transformers import AutoModelForCausalLM

    # The model's own counts, not the sharded view: under ZeRO-3 each rank holds half of every parameter.
    flops = parameter_counts(AutoModelForCausalLM.from_pretrained(tiny_model_dir)).flops_per_token
    measured = [r for r in progress(tmp_path) if r["tokensPerSecond"]]
    assert measured
    for r in measured:
        assert r["tokensPerSecondPerDevice"] == pytest.approx(r["tokensPerSecond"] / 2)
        assert r["mfu"] == pytest.approx(r["tokensPerSecondPerDevice"] * flops / 1e9, rel=1e-3, abs=1e-4)
        assert r["peakMemoryGiB"] is None  # CPU: no accelerator memory to report
    final = tmp_path / "output" / "final" / "model.safetensors"
    assert final.stat().st_size > 0  # ZeRO-3 gathered the 16-bit weights on save (not an empty file)


def test_streaming_on_two_nodes_trains_evaluates_and_tokenizes_nothing_ahead(tiny_model_dir, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for i in range(2):  # two files = two shards: accelerate gives each process one
        (data_dir / f"part-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[i::2]))
    doc = job(tiny_model_dir, **{
        "spec.data": {"format": "alpaca", "maxLength": 64, "train": [{"path": str(data_dir)}], "streaming": True,
                      "packing": True, "validation": [{"inline": ROWS[:4]}]},
        "spec.distributed": {"numNodes": 2, "gpusPerNode": 0}, "spec.training.maxSteps": 6,
        "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 3, "spec.checkpoints.saveSteps": 3})
    results = ok(run_nodes(doc, tmp_path / "run"))
    s = results[0].summary
    assert (s["steps"], s["worldSize"], s["data"]["streaming"]) == (6, 2, {"trainShards": 2})
    streamed = s["data"]["streamed"]  # the rows both ranks read, summed: none cut or left out here
    assert streamed["train"]["kept"] == streamed["train"]["rows"] > 0 and streamed["train"]["first"] == {}
    assert s["tokensSeen"] > 0 and (tmp_path / "run" / "output" / "final" / "model.safetensors").stat().st_size > 0
    assert [r["step"] for r in progress(tmp_path / "run") if r.get("evalLoss") is not None] == [3, 6]
    assert not (tmp_path / "run" / "output" / ".cache" / "tokenized").exists()  # streamed: nothing tokenized ahead


@pytest.mark.parametrize("repeat", range(3))
def test_a_stop_signal_on_one_node_stops_every_rank_at_the_same_step_with_one_checkpoint(tiny_model_dir, tmp_path,
                                                                                       repeat):
    """A pod deletion or preemption reaches the nodes of a gang at different moments (here: only node 1). The
    ranks agree on the stop step (an all-reduce of the stop flag at every step end), so every rank saves the same
    complete checkpoint and exits 143; none waits in a collective the other left, none redoes a step."""
    import random
    import signal
    import time

    from finetune_operator.api.validation import validate_job
    from finetune_operator.cli.local_run import start_nodes
    from finetune_operator.cli.processes import kill_tree
    from tests.support.trainer_run import TEST_ENV

    doc = job(tiny_model_dir, **{"spec.distributed": {"numNodes": 2, "gpusPerNode": 0},
                                 "spec.training.maxSteps": 100000, "spec.checkpoints.saveSteps": 100000})
    nodes = start_nodes(validate_job(doc), tmp_path, extra_env=TEST_ENV)
    try:
        progress_file = tmp_path / "output" / "progress.jsonl"
        wanted = 3 + random.Random(repeat).randrange(6)
        wait_for_run(f"{wanted} steps", lambda: progress_file.exists()
                     and progress_file.read_text().count('"step"') >= wanted, tmp_path,
                     alive=lambda: all(n.process.poll() is None for n in nodes))
        time.sleep(random.Random(repeat).random() * 0.3)  # anywhere within a step
        nodes[1].process.send_signal(signal.SIGTERM)
        codes = [n.process.wait(timeout=300) for n in nodes]
    finally:
        for n in nodes:
            if n.process.poll() is None:
                kill_tree(n.process.pid)
    logs = [n.log_file.read_text()[-2000:] for n in nodes]
    assert codes == [exit_codes.INTERRUPTED] * 2, logs
    steps = {json.loads(n.result_file.read_text())["message"].split(" at step ")[1].split(";")[0] for n in nodes}
    (checkpoint,) = (tmp_path / "output").glob("checkpoint-*")
    assert steps == {checkpoint.name.split("-")[1]}  # one stop step for both ranks, and its checkpoint
    assert (checkpoint / "FINETUNE_COMPLETE").exists()


def test_early_stopping_ends_on_a_plateau_and_keeps_the_best_checkpoint_with_perplexity(tiny_model_dir, tmp_path):
    """A threshold no decrease can meet: every evaluation after the first is "no improvement", so training stops
    after `patience` of them, long before maxSteps; the final model is the checkpoint with the lowest loss."""
    doc = job(tiny_model_dir, **{
        "spec.data": {"format": "alpaca", "maxLength": 64, "train": [{"inline": ROWS}],
                      "validation": [{"inline": ROWS[:4]}]},
        "spec.training.maxSteps": 40, "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 2,
        "spec.checkpoints": {"saveSteps": 2, "keep": 2},
        "spec.evaluation": {"earlyStopping": {"patience": 2, "threshold": 1000.0}}})
    s = ok(run_nodes(doc, tmp_path / "run"))[0].summary
    assert s["stoppedEarly"] is True and s["steps"] == 6, s  # evaluations at 2, 4 and 6; 4 and 6 "no improvement"
    evaluated = [r for r in progress(tmp_path / "run") if r.get("evalLoss") is not None]
    assert [r["step"] for r in evaluated] == [2, 4, 6]
    best = min(evaluated, key=lambda r: r["evalLoss"])
    assert s["bestCheckpoint"].endswith(f"checkpoint-{best['step']}") and s["bestEvalLoss"] == pytest.approx(
        best["evalLoss"])
    for r in evaluated:  # perplexity next to every validation loss
        assert r["evalPerplexity"] == pytest.approx(math.exp(r["evalLoss"]))
    assert s["evalPerplexity"] == pytest.approx(math.exp(s["evalLoss"]))


def test_lora_init_from_continues_an_adapter_where_it_stopped(tiny_model_dir, tmp_path):
    lora = {"type": "lora", "lora": {"r": 4, "alpha": 8, "dropout": 0.0}}
    first = ok(run_nodes(job(tiny_model_dir, **{"spec.method": lora, "spec.training.maxSteps": 30}),
                         tmp_path / "first"))[0].summary
    adapter = tmp_path / "first" / "output" / "final"
    trained = losses_by_step(tmp_path / "first")
    # A second job starts from that adapter (r 16 asked for here is ignored: the adapter's own r 4 is used).
    again = {**lora, "lora": {"r": 16, "initFrom": str(adapter)}}
    second = ok(run_nodes(job(tiny_model_dir, **{"spec.method": again, "spec.training.maxSteps": 3,
                                                 "spec.training.learningRate": 1e-9}), tmp_path / "second"))[0].summary
    continued = losses_by_step(tmp_path / "second")
    assert second["adapterInitFrom"] == str(adapter)
    assert second["trainableParameters"] == first["trainableParameters"]  # the adapter's shapes, not r 16
    # It starts where the first left off (the same batches, the same adapter): far below a fresh adapter's start.
    assert continued[1] == pytest.approx(trained[30], abs=0.5) and continued[1] < trained[1] - 0.5, (trained,
                                                                                                      continued)
    broken = job(tiny_model_dir, **{"spec.method": {"type": "lora", "lora": {"initFrom": str(tmp_path / "none")}},
                                    "spec.training.maxSteps": 2})
    (failed,) = run_nodes(broken, tmp_path / "broken")[:1]
    assert failed.returncode == exit_codes.CONFIG_ERROR and "spec.method.lora.initFrom" in failed.summary["message"]


def test_a_tokenizer_with_new_tokens_grows_the_model_and_the_adapter_keeps_their_rows(tiny_model_dir, tmp_path):
    """model.tokenizer with tokens the base model lacks: the embedding and head grow (mean-initialised), LoRA trains
    and saves them (modules_to_save), and final/ loads back into a model that knows the new tokens."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extended = tmp_path / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base_rows = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>", "<|/tool|>"]})
    tokenizer.save_pretrained(extended)
    rows = [{"instruction": f"Call the adder on {a} and {b}.", "output": f"<|tool|>add({a}, {b})<|/tool|>"}
            for a in range(1, 5) for b in range(1, 5)]
    doc = job(tiny_model_dir, **{"spec.model": {"name": str(tiny_model_dir), "dtype": "float32",
                                                "tokenizer": str(extended)},
                                 "spec.data": {"format": "alpaca", "maxLength": 64, "train": [{"inline": rows}]},
                                 "spec.method": {"type": "lora", "lora": {"r": 4, "alpha": 8}},
                                 "spec.training.maxSteps": 6})
    ok(run_nodes(doc, tmp_path / "run"))
    final = tmp_path / "run" / "output" / "final"
    loaded_tokenizer = AutoTokenizer.from_pretrained(final)
    assert len(loaded_tokenizer) == base_rows + 2
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    untrained = base.get_input_embeddings().weight.detach().clone()
    base.resize_token_embeddings(len(loaded_tokenizer))
    model = PeftModel.from_pretrained(base, final)
    embeddings = model.get_input_embeddings().weight
    assert embeddings.shape[0] == base_rows + 2
    new_ids = loaded_tokenizer.convert_tokens_to_ids(["<|tool|>", "<|/tool|>"])
    # The new rows started at the mean of the old ones and were trained away from it.
    mean = untrained.mean(dim=0)
    assert all(not torch.allclose(embeddings[i], mean, atol=1e-4) for i in new_ids)
    assert torch.isfinite(model(torch.tensor([new_ids])).logits).all()


def test_generation_samples_at_every_evaluation_and_at_the_end(tiny_model_dir, tmp_path):
    prompts = ["What is 2 plus 3?", "What is 4 plus 1?"]
    doc = job(tiny_model_dir, **{
        "spec.data": {"format": "alpaca", "maxLength": 64, "train": [{"inline": ROWS}],
                      "validation": [{"inline": ROWS[:4]}]},
        "spec.training.maxSteps": 6, "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 3,
        "spec.evaluation": {"prompts": prompts, "generation": {"maxNewTokens": 6, "doSample": False}}})
    s = ok(run_nodes(doc, tmp_path / "run"))[0].summary
    output = tmp_path / "run" / "output"
    records = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines()]
    assert [(r["at"], r["prompt"]) for r in records] == [(at, p) for at in ("3", "6", "final") for p in prompts]
    assert all(isinstance(r["completion"], str) and r["completion"] for r in records), records
    assert [(r["at"], r["completion"]) for r in s["samples"]] == [(r["at"], r["completion"]) for r in records[-2:]]
    # Greedy decoding of the same weights: the final samples repeat the step-6 ones.
    assert [r["completion"] for r in records[2:4]] == [r["completion"] for r in records[4:]]
    events = b"".join(f.read_bytes() for f in output.rglob("events.out.tfevents.*"))
    assert b"samples/0" in events and prompts[0].encode() in events  # TensorBoard text


def test_the_trainer_destroys_its_process_group_before_the_interpreter_exits(tmp_path):
    """The crash of a two-node streaming run (rank 0: SIGABRT, "terminate called without an active exception", after
    its run succeeded): a process that exits with its gloo group alive lets a worker thread of the group drop the
    last reference to a finished collective's tensor while the interpreter finalizes; the GIL it needs is gone, the
    thread is torn down inside a C++ destructor and the process aborts (4 of 60 bare gloo runs did, docs/results.md).
    The trainer destroys the group on every way out, here a config error, while Python is still whole."""
    import subprocess
    import sys

    from tests.support.trainer_run import TEST_ENV

    script = ("import sys, torch.distributed as dist\n"
              "from finetune_trainer.main import main\n"
              f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
              f"code = main(['--config', '{tmp_path / 'missing.json'}'])\n"
              "print('exit', code, 'group alive', dist.is_initialized())\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, **TEST_ENV}, check=False)
    assert f"exit {exit_codes.CONFIG_ERROR} group alive False" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("scheduler", ["constant", "linear"])
def test_a_resume_with_another_learning_rate_honours_it_and_says_so(tiny_model_dir, tmp_path, scheduler):
    """The issue: a resumed run with a new learningRate silently went on with the old one (the checkpoint's
    scheduler state wins). Now the spec's rate is the peak of the same schedule from the resumed step on, and a
    LearningRateChanged warning says what changed and how to keep the old one."""
    first = job(tiny_model_dir, **{"spec.training.maxSteps": 8, "spec.training.lrScheduler": scheduler})
    ok(run_nodes(job(tiny_model_dir, **{"spec.training.maxSteps": 4, "spec.training.lrScheduler": "constant"})
                 if scheduler == "constant" else first, tmp_path))
    if scheduler == "linear":  # stop it at step 4: the run resumes from checkpoint-4 of an 8-step schedule
        for extra in sorted((tmp_path / "output").glob("checkpoint-*"))[1:]:
            shutil.rmtree(extra)
    again = job(tiny_model_dir, **{"spec.training.maxSteps": 8, "spec.training.learningRate": 0.03,
                                   "spec.training.lrScheduler": scheduler})
    (result,) = ok(run_nodes(again, tmp_path))
    (said,) = [w for w in result.summary.get("warnings", []) if w["reason"] == "LearningRateChanged"]
    assert "resuming at step 4, trained with learningRate 0.003, with learningRate 0.03" in said["message"], said
    assert "to continue unchanged set spec.training.learningRate: 0.003" in said["message"]
    rates = {r["step"]: r["learningRate"] for r in progress(tmp_path) if r.get("learningRate") is not None}
    if scheduler == "constant":
        assert [rates[s] for s in range(5, 9)] == [pytest.approx(0.03)] * 4, rates
    else:  # linear decay to 0 at step 8, from 0.03 instead of 0.003: ten times the old rate at each step
        assert [rates[s] for s in range(5, 9)] == [pytest.approx(0.03 * (8 - s + 1) / 8) for s in range(5, 9)], rates
