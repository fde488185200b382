"""The `finetune` CLI: exit codes, every error printed, a parseable YAML stream."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finetune_operator.cli.main import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, EXIT_USAGE, apply_overrides, main
from tests.conftest import CRD_FILE, EXAMPLES, ROOT

TINY = str(ROOT / "examples" / "tiny-cpu-sft.yaml")


def test_validate_ok_shows_topology_and_global_batch(capsys):
    assert main(["validate", str(ROOT / "examples" / "llama-lora-zero3-2x8.yaml")]) == EXIT_OK
    out = capsys.readouterr().out
    assert "2 node(s) x 8 GPU(s) = 16 process(es), deepspeed ZeRO-3" in out
    assert "global batch size 128 = 2 per device x 4 accumulation x 16 process(es)" in out


def test_validate_invalid_prints_every_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"metadata": {"name": "x"}, "spec": {
        "model": {"name": "m"}, "data": {"format": "alpaca", "train": [{"path": "/a"}]},
        "distributed": {"numNodes": 0, "gpusPerNode": "eight"}}}))
    assert main(["validate", str(bad)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "2 error(s)" in err
    assert "spec.distributed.numNodes" in err and "spec.distributed.gpusPerNode" in err


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("spec:\n  model: [unclosed\n")
    assert main(["validate", str(bad)]) == EXIT_USAGE
    assert f"{bad}:3:" in capsys.readouterr().err


def test_missing_file(capsys):
    assert main(["validate", "/nonexistent.yaml"]) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err


def test_render_prints_a_yaml_stream(capsys):
    assert main(["render", TINY, "--namespace", "team-a", "--attempt", "3"]) == EXIT_OK
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Job"]
    assert docs[-1]["metadata"]["name"] == "tiny-cpu-sft-a3"
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}


def test_crd_command_prints_the_committed_crds(capsys):
    """Every CRD we serve, as committed (the job's, then the runtimes'): `finetune crd | kubectl apply -f -`."""
    assert main(["crd"]) == EXIT_OK
    crds = CRD_FILE.parent
    assert capsys.readouterr().out == "---\n".join(
        (crds / name).read_text()
        for name in ("finetunejob.yaml", "finetuneruntime.yaml", "clusterfinetuneruntime.yaml"))


def test_installed_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "finetune_operator", "validate", *map(str, EXAMPLES)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": valid") == len(EXAMPLES)


def test_exponent_numbers_are_numbers_as_in_kubectl(tmp_path, capsys):
    """YAML 1.1 (PyYAML) reads 2e-5 as a string; the API is strict about types, so the loader reads it as kubectl."""
    path = tmp_path / "job.yaml"
    path.write_text(Path(TINY).read_text().replace("learningRate: 0.005", "learningRate: 5e-3"))
    assert "5e-3" in path.read_text()
    assert main(["validate", str(path)]) == EXIT_OK
    assert apply_overrides({}, ["spec.training.learningRate=2E-5"]) == {"spec": {"training": {"learningRate": 2e-05}}}


def test_run_progress_line_shows_mfu_and_memory_only_when_measured():
    from finetune_operator.cli.progress import render_progress

    record = {"step": 5, "maxSteps": 10, "loss": 1.5, "tokensPerSecond": 12000.0, "eta": "0m05s"}
    assert "MFU" not in render_progress(record) and "GiB" not in render_progress(record)
    line = render_progress({**record, "mfu": 0.4213, "peakMemoryGiB": 61.27})
    assert "12000 tok/s  MFU 42.1%  61.3 GiB  ETA 0m05s" in line


def test_validate_reads_standard_input(monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(Path(TINY).read_text()))
    assert main(["validate", "-"]) == EXIT_OK
    assert "-: tiny-cpu-sft: valid" in capsys.readouterr().out


def test_validate_json_output_lists_each_result_with_its_errors(tmp_path, capsys):
    import json

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"metadata": {"name": "bad"}, "spec": {
        "model": {"name": "m"}, "data": {"format": "alpaca", "train": [{"path": "/a"}]},
        "distributed": {"numNodes": 0}}}))
    assert main(["validate", "-o", "json", TINY, str(bad)]) == EXIT_INVALID
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["name"], r["valid"]) for r in results] == [("tiny-cpu-sft", True), ("bad", False)]
    assert results[0]["processes"] == 1 and results[0]["globalBatchSize"] >= 1
    (error,) = results[1]["errors"]
    assert error["path"] == "spec.distributed.numNodes" and error["value"] == 0 and error["fix"]


def test_validate_yaml_output_parses(capsys):
    assert main(["validate", "--output", "yaml", TINY]) == EXIT_OK
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["results"][0]["name"] == "tiny-cpu-sft" and doc["results"][0]["valid"] is True


def test_render_json_is_a_list_like_kubectl_prints(capsys):
    import json

    assert main(["render", TINY, "-n", "team-b", "-o", "json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "List" and doc["apiVersion"] == "v1"
    assert [o["kind"] for o in doc["items"]][-3:] == ["ConfigMap", "Service", "Job"]
    assert {o["metadata"]["namespace"] for o in doc["items"]} == {"team-b"}


def test_version_names_the_package_and_the_transformers_it_checks_against(capsys):
    from finetune_operator import __version__
    from finetune_operator.api.transformers_names import TRANSFORMERS_VERSION

    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    out = capsys.readouterr().out
    assert __version__ in out and TRANSFORMERS_VERSION in out


def test_run_refuses_an_invalid_spec_with_the_trainers_permanent_code(tmp_path, capsys):
    """78 (InvalidConfig) like the trainer, so scripts never retry it; nothing is started."""
    from finetune_operator.api import exit_codes

    code = main(["run", TINY, "--set", "spec.distributed.numNodes=0", "--output", str(tmp_path / "run")])
    assert code == exit_codes.CONFIG_ERROR and exit_codes.is_permanent(code)
    assert "spec.distributed.numNodes" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_progress_line_says_what_preparation_does_and_prints_an_evaluation_once(tmp_path):
    import io

    from finetune_operator.cli.progress import ProgressLine

    path = tmp_path / "progress.jsonl"
    records = [{"phase": "Preparing", "message": "tokenizing the training data", "elapsedSeconds": 0},
               {"phase": "Preparing", "message": "tokenizing the training data", "elapsedSeconds": 30},
               {"step": 5, "maxSteps": 10, "loss": 1.5},
               {"step": 5, "maxSteps": 10, "loss": 1.5, "evalLoss": 1.25},
               {"step": 6, "maxSteps": 10, "loss": 1.4}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = io.StringIO()
    ProgressLine(tmp_path / "none.jsonl", out).poll()
    line = ProgressLine(path, out)
    line.progress.offset = 0
    line.poll()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["preparing: tokenizing the training data (0s)",
                         "preparing: tokenizing the training data (30s)"]
    assert lines[3] == "  eval loss 1.2500 at step 5" and len(lines) == 5
    assert "eval 1.2500" in lines[4]  # later lines keep showing the newest evaluation


def test_the_run_summary_shows_eval_loss_perplexity_the_plot_and_the_last_samples(tmp_path):
    from finetune_operator.cli.local_run import describe_result

    summary = {"steps": 30, "finalLoss": 1.23456, "evalLoss": 1.5, "evalPerplexity": 4.4817, "model": "out/final",
               "lossPlot": "out/loss.png", "stoppedEarly": True, "bestCheckpoint": "out/checkpoint-20",
               "samples": [{"prompt": "What is\n2 plus 3?", "completion": "5" * 100}]}
    text = describe_result(0, summary, tmp_path)
    assert "final loss 1.235, eval loss 1.5 (perplexity 4.482); stopped early, best checkpoint out/checkpoint-20" \
        in text
    assert "loss plot:  out/loss.png" in text
    assert "sample:     'What is 2 plus 3?' -> '" + "5" * 57 + "...'" in text


def test_a_preference_evaluation_shows_the_held_out_accuracy_and_margin_not_a_perplexity(tmp_path):
    import io

    from finetune_operator.cli.local_run import describe_result
    from finetune_operator.cli.progress import ProgressLine

    path = tmp_path / "progress.jsonl"
    records = [{"step": 4, "maxSteps": 8, "loss": 0.6},
               {"step": 4, "maxSteps": 8, "loss": 0.6, "evalLoss": 0.5, "evalRewardsAccuracy": 1.0,
                "evalRewardsMargin": 0.25}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = io.StringIO()
    line = ProgressLine(path, out)
    line.progress.offset = 0
    line.poll()
    said = out.getvalue().splitlines()[1]
    assert said == "  eval loss 0.5000 (held-out preference accuracy 1, margin 0.25) at step 4"
    text = describe_result(0, {"steps": 8, "finalLoss": 0.6, "evalLoss": 0.5, "evalRewardsAccuracy": 1.0,
                               "evalRewardsMargin": 0.25, "model": "out/final"}, tmp_path)
    assert "final loss 0.6, eval loss 0.5 (held-out preference accuracy 1, margin 0.25)" in text
    assert "perplexity" not in text


def _gpu_dev(tmp_path: Path, count: int) -> Path:
    """A /dev as the NVIDIA driver leaves it: one node per GPU beside the control nodes that are not GPUs."""
    for name in [f"nvidia{i}" for i in range(count)] + ["nvidiactl", "nvidia-uvm", "nvidia-modeset"]:
        (tmp_path / name).touch()
    return tmp_path


def test_visible_gpus_counts_device_nodes_narrowed_by_cuda_visible_devices(tmp_path, monkeypatch):
    from finetune_operator.cli.local_run import visible_gpus

    dev = _gpu_dev(tmp_path, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus(dev) == 4
    (tmp_path / "cpu-only").mkdir()
    assert visible_gpus(_gpu_dev(tmp_path / "cpu-only", 0)) == 0
    for value, expected in [("0,1", 2), ("", 0), ("-1", 0), ("2,-1,3", 1), ("0,1,2,3,4,5", 4)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_gpus(dev) == expected, value


def test_a_local_run_of_a_gpu_job_on_a_machine_without_enough_gpus_says_which_field_to_change(tmp_path, capsys,
                                                                                               monkeypatch):
    """The TrainingArguments error it replaces ("bf16/gpu ... assign use_cpu") named no field of the spec."""
    from finetune_operator.api import exit_codes
    from finetune_operator.cli import local_run

    gpu_job = tmp_path / "gpu.yaml"
    gpu_job.write_text(Path(TINY).read_text().replace("gpusPerNode: 0", "gpusPerNode: 2"))
    started = []
    monkeypatch.setattr(local_run, "start_nodes", lambda *a, **k: started.append(a))
    monkeypatch.setattr(local_run, "visible_gpus", lambda: 1)
    assert main(["run", str(gpu_job), "--output", str(tmp_path / "run")]) == exit_codes.CONFIG_ERROR
    out = capsys.readouterr().out
    assert ("spec.distributed.gpusPerNode: 2: each node's processes need that many GPUs and on this machine 1 "
            "NVIDIA GPU(s) are visible; fix: --set spec.distributed.gpusPerNode=0") in out
    assert not started and not (tmp_path / "run").exists()
    assert "claimName" not in out  # a local run has no pods to lose an emptyDir with


@pytest.mark.parametrize("absent", ["torch", "trl", "matplotlib", "torch+transformers"])
def test_a_local_run_without_the_trainers_packages_says_what_to_install_and_starts_nothing(tmp_path, capsys,
                                                                                          monkeypatch, absent):
    """`pip install .` without the trainer extra: validate and render work; run names the missing packages and the
    extra, instead of a node failing with ModuleNotFoundError and "run the same command again to resume"."""
    import importlib.util

    from finetune_operator.api import exit_codes
    from finetune_operator.cli import local_run

    real = importlib.util.find_spec
    missing = absent.split("+")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    started = []
    monkeypatch.setattr(local_run, "start_nodes", lambda *a, **k: started.append(a))
    assert main(["validate", TINY]) == EXIT_OK and main(["render", TINY]) == EXIT_OK
    capsys.readouterr()
    assert main(["run", TINY, "--output", str(tmp_path / "run")]) == exit_codes.CONFIG_ERROR
    out = capsys.readouterr().out
    assert f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed" in out, out
    assert "pip install '.[trainer]'" in out and "resume" not in out
    assert not started and not (tmp_path / "run").exists()
    assert local_run.missing_trainer_packages() is not None
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert local_run.missing_trainer_packages() is None  # this venv has them all


def test_the_trainers_warnings_and_notes_are_printed_once_each_as_they_come(tmp_path):
    """notices.jsonl carries the trainer's warnings (LossSpike, GlobalBatchChanged, ...) and notes: `finetune run`
    prints each once, on a line of its own, between the progress lines; progress.jsonl keeps only step records."""
    import io
    import json

    from finetune_operator.cli.progress import ProgressLine
    from finetune_trainer.outputs.status_report import Warnings

    progress, notices = tmp_path / "progress.jsonl", tmp_path / "notices.jsonl"
    out = io.StringIO()
    line = ProgressLine(progress, out, notices)
    warn = Warnings(journal=notices)
    warn.note("resuming from checkpoint-20 (step 20: /out/checkpoint-20)")
    line.poll()
    with progress.open("a") as f:
        f.write(json.dumps({"step": 21, "maxSteps": 30, "loss": 2.5, "learningRate": 1e-3,
                            "tokensPerSecond": 10.0}) + "\n")
    warn("LossSpike", "the loss spiked to 40 at step 21")
    with notices.open("a") as f:
        f.write('{"time": "2026-01-01T00:00:00Z", "note": "half a li')  # still being written: read next time
    line.poll()
    line.poll()  # nothing new: nothing printed twice
    printed = out.getvalue().splitlines()
    assert printed == ["resuming from checkpoint-20 (step 20: /out/checkpoint-20)",
                       "warning: LossSpike: the loss spiked to 40 at step 21", printed[2]]
    assert printed[2].startswith("[") and "21/30" in printed[2]
    assert not progress.read_text().count("notice") and [w["reason"] for w in warn.said] == ["LossSpike"]
    with notices.open("a") as f:
        f.write('ne"}\n')
    line.poll()
    assert out.getvalue().splitlines()[-1] == "half a line"


def test_uploads_behind_say_why_on_the_progress_line():
    from finetune_operator.cli.progress import render_progress

    line = render_progress({"step": 1000, "maxSteps": 1000, "upload": {
        "pending": 2, "behindSince": "2026-01-01T00:00:00Z",
        "lastError": "s3://b/run: the store at http://minio:9000 did not answer (EndpointConnectionError: ...)"}})
    assert "uploads behind: 2 checkpoint(s) since 2026-01-01T00:00:00Z, retrying: s3://b/run: the store at " \
        "http://minio:9000 did not answer" in line


def test_the_summary_says_what_reached_the_bucket_and_what_did_not(tmp_path):
    from finetune_operator.cli.local_run import describe_result

    done = describe_result(0, {"steps": 30, "finalLoss": 1.0, "model": "final", "uploaded": {
        "uri": "s3://b/run", "completeStep": 30}}, tmp_path)
    assert "uploaded:   s3://b/run (final/, progress, loss.png, checkpoints up to step 30)" in done
    behind = describe_result(0, {"steps": 30, "finalLoss": 1.0, "model": "final", "uploaded": {
        "uri": "s3://b/run", "completeStep": 10, "checkpointsNotUploaded": [20, 30]}}, tmp_path)
    assert "checkpoints up to step 10); not uploaded: checkpoint(s) at step 20, 30 (kept here)" in behind


def test_validate_and_render_print_the_memory_estimate_from_a_model_config(capsys):
    """The 2x8 ZeRO-3 LoRA example of Llama-3.1-8B (config.json as published): the table per GPU, the verdict
    against the H100s its node selector names, and the same as data in -o json. Without a config the text says how
    to get one."""
    example = str(ROOT / "examples" / "llama-lora-zero3-2x8.yaml")
    config = str(ROOT / "tests" / "data" / "model_configs" / "llama-3.1-8b.json")
    assert main(["validate", example, "--model-config", config]) == EXIT_OK
    out = capsys.readouterr().out
    assert "memory per GPU (16 processes, " in out and "activations" in out and "needed" in out
    assert main(["validate", example, "--model-config", config, "-o", "json"]) == EXIT_OK
    memory = json.loads(capsys.readouterr().out)["results"][0]["memoryEstimate"]
    assert memory["largestTerm"] in memory["terms"] and memory["neededGiB"] > memory["peakGiB"] > 0
    assert main(["validate", example]) == EXIT_OK
    assert "pass --model-config FILE" in capsys.readouterr().out
    assert main(["render", example, "--model-config", config]) == EXIT_OK
    captured = capsys.readouterr()
    assert "memory per GPU" in captured.err and "memory per GPU" not in captured.out  # stdout stays YAML


def _fsdp_example(tmp_path, gib: int = 40, **fsdp) -> str:
    doc = yaml.safe_load((ROOT / "examples" / "cpt-fsdp.yaml").read_text())
    doc["spec"]["distributed"]["fsdp"].update(fsdp)
    doc["spec"]["resources"]["gpuMemoryGiB"] = gib
    path = tmp_path / f"job-{gib}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_exits_3_for_a_valid_spec_that_does_not_fit_and_render_says_so(tmp_path, capsys):
    """A CI gate must not pass a spec that needs more than its GPUs hold (the issue: "valid", exit 0, for 125.6 GiB
    of 80). An FSDP spec with an fsdp: block is the case that crashed validate and render (a pydantic traceback):
    every remedy is now a spec the API takes. An invalid spec in the same run still exits 1."""
    config = str(ROOT / "tests" / "data" / "model_configs" / "llama-3.2-1b.json")
    tight = _fsdp_example(tmp_path, activationCheckpointing=False)
    assert main(["validate", tight, "--model-config", config]) == EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    assert "cpt-fsdp: valid, but DOES NOT FIT" in out and "what fits: distributed.fsdp.activationCheckpointing" in out
    assert main(["validate", tight, "--model-config", config, "-o", "json"]) == EXIT_DOES_NOT_FIT
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert result["valid"] is True and result["fits"] is False and result["memoryEstimate"]["suggestion"]
    assert main(["render", tight, "--model-config", config]) == EXIT_OK  # render shows; validate gates
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.err and "kind: ConfigMap" in captured.out
    tiny = _fsdp_example(tmp_path, gib=10, activationCheckpointing=False)  # where checkpointing alone is not enough
    assert main(["validate", tiny, "--model-config", config]) == EXIT_DOES_NOT_FIT
    assert main(["render", tiny, "--model-config", config]) == EXIT_OK
    assert "what fits: " in capsys.readouterr().err
    fitting = str(tmp_path / "fits.yaml")
    Path(fitting).write_text(Path(_fsdp_example(tmp_path, activationCheckpointing=True)).read_text())
    assert main(["validate", fitting, "--model-config", config]) == EXIT_OK
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"metadata": {"name": "x"}, "spec": {"model": {"name": "m"}}}))
    assert main(["validate", tight, str(bad), "--model-config", config]) == EXIT_INVALID


def test_once_a_node_fails_the_others_get_a_grace_then_a_stop_then_a_kill(tmp_path):
    """Real processes: node 0 fails at once; node 1 stops on SIGTERM (exit 143), node 2 ignores it and is killed.
    The first failure is the one reported."""
    import io
    import subprocess
    import sys

    from finetune_operator.cli.local_run import Node, results, wait
    from finetune_operator.cli.progress import ProgressLine

    scripts = ["import sys; sys.exit(3)",
               "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(60)",
               "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
    nodes = [Node(rank, subprocess.Popen([sys.executable, "-c", script]), tmp_path / f"node-{rank}.result.json",
                  tmp_path / f"node-{rank}.log") for rank, script in enumerate(scripts)]
    out = io.StringIO()
    failed = wait(nodes, ProgressLine(tmp_path / "progress.jsonl", out, tmp_path / "notices.jsonl"), out,
                  grace=1.0, kill_after=2.0)
    assert [n.process.returncode for n in nodes] == [3, 143, -9]
    assert failed == [0, 1, 2]
    assert "node 0 exited with 3: stopping the other node(s)" in out.getvalue()
    assert results(nodes, failed) == (3, {})


def test_a_node_that_dies_of_the_stop_it_was_sent_is_a_clean_interrupt(tmp_path):
    """Ctrl-C in a node's first moments, before its launcher installed a handler: it dies of SIGTERM (-15). That is
    the stop that was asked for (143, resumable), not a failure (the CLI said 241); a node killed by a SIGTERM
    nobody here sent is still one."""
    import io
    import signal
    import subprocess
    import sys

    from finetune_operator.api import exit_codes
    from finetune_operator.cli.local_run import Node, results, stop

    def node(rank: int) -> Node:
        return Node(rank, subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
                    tmp_path / f"node-{rank}.result.json", tmp_path / f"node-{rank}.log")

    nodes = [node(0), node(1)]
    stop(nodes, io.StringIO())
    for n in nodes:
        n.process.wait(timeout=30)
    assert [n.process.returncode for n in nodes] == [-signal.SIGTERM] * 2
    code, summary = results(nodes, [0, 1])
    assert code == exit_codes.INTERRUPTED and summary["reason"] == "Interrupted"
    assert "nothing to save yet" in summary["message"]
    stranger = node(0)
    stranger.process.send_signal(signal.SIGTERM)
    stranger.process.wait(timeout=30)
    assert results([stranger], [0]) == (-signal.SIGTERM, {})


def test_validate_says_what_a_preference_objective_trains_on(tmp_path, capsys):
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-dpo.yaml").read_text())
    for objective, says in [("dpo", "(lora, dpo on pairs)"),
                            ("kto", "(lora, kto on pairs, each one desirable and one undesirable example)"),
                            ("orpo", "(lora, orpo on pairs, no reference model)"),
                            ("cpo", "(lora, cpo on pairs, no reference model)")]:
        doc["spec"]["method"].update(objective=objective, preference={"beta": 0.1})
        job = tmp_path / f"{objective}.yaml"
        job.write_text(yaml.safe_dump(doc))
        assert main(["validate", str(job)]) == EXIT_OK
        assert says in capsys.readouterr().out
