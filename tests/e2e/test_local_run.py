"""`finetune run`: the README's main command, as a user runs it (a subprocess, Ctrl-C included)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune_operator.api import exit_codes
from finetune_operator.cli.processes import kill_tree
from tests.conftest import ROOT
from tests.support.polling import wait_for_run, wait_until

TINY = str(ROOT / "examples" / "tiny-cpu-sft.yaml")


RUNNING: list[subprocess.Popen] = []


def finetune(*args, **kwargs) -> subprocess.Popen:
    # This checkout's packages, not the ones the shared environment has installed (another checkout's).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")])}
    proc = subprocess.Popen([sys.executable, "-m", "finetune_operator", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, **kwargs)
    RUNNING.append(proc)
    return proc


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Whatever a failing test left running (the CLI and every node under it) is killed."""
    yield
    while RUNNING:
        kill_tree(RUNNING.pop().pid)


def test_runs_the_tiny_example_to_a_saved_model(tiny_model_dir, tmp_path):
    proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--output", str(tmp_path))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "Succeeded: 30 steps, final loss" in out
    assert "30/30" in out and "tok/s" in out  # the progress line
    assert (tmp_path / "output" / "final" / "adapter_model.safetensors").stat().st_size > 0
    # The picture at the end: loss against step, written by the trainer, named in the summary.
    plot = tmp_path / "output" / "loss.png"
    assert f"loss plot:  {plot}" in out and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "preparing: tokenizing the training data: 6 rows from inline rows" in out  # what the heartbeat says
    summary = json.loads((tmp_path / "logs" / "node-0.result.json").read_text())
    assert summary["attemptSteps"] == 30 and summary["attemptTokens"] == summary["tokensSeen"] > 0
    assert f"tokens/s:   {summary['tokensSeen'] / summary['trainRuntimeSeconds']:.0f}" in out

    # The same command again resumes the finished run: nothing is trained, so no rate or training loss is claimed.
    again = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--output", str(tmp_path))
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out
    assert "Succeeded: 30 steps" in out and "resumed:    from" in out and "tokens/s:" not in out
    # The trainer's note and warning reach the console, once each (not only the node log).
    assert out.count("resuming from checkpoint-30 (step 30: ") == 1, out
    assert out.count("warning: ResumedAtFinalStep: ") == 1, out
    summary = json.loads((tmp_path / "logs" / "node-0.result.json").read_text())
    assert summary["attemptSteps"] == 0 and summary["trainLoss"] is None and summary["tokensPerSecond"] is None
    # ... and says so: a warning in the summary (an Event in a cluster), not a silent Succeeded.
    (said,) = [w for w in summary["warnings"] if w["reason"] == "ResumedAtFinalStep"]
    assert "already at the final step (30): nothing was trained" in said["message"]


def test_ctrl_c_leaves_a_checkpoint_and_the_same_command_resumes(tiny_model_dir, tmp_path):
    args = ["run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set", "spec.checkpoints.saveSteps=100000",
            "--output", str(tmp_path)]
    proc = finetune(*args, "--set", "spec.training.maxSteps=100000")
    progress = tmp_path / "output" / "progress.jsonl"
    wait_for_run("20 steps", lambda: progress.exists() and progress.read_text().count('"step"') >= 20, tmp_path,
                 alive=lambda: proc.poll() is None)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the foreground process
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == exit_codes.INTERRUPTED, out
    assert "run the same command again to resume" in out
    assert "stopped by Ctrl-C in finetune run (or a SIGTERM sent to it) at step" in out  # not "signal 15"
    (checkpoint,) = (tmp_path / "output").glob("checkpoint-*")
    stopped_at = int(checkpoint.name.split("-")[1])
    assert stopped_at >= 20 and (checkpoint / "FINETUNE_COMPLETE").exists()
    before = len(progress.read_text().splitlines())

    again = finetune(*args, "--set", f"spec.training.maxSteps={stopped_at + 5}")
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out
    assert f"Succeeded: {stopped_at + 5} steps" in out and f"resumed:    from {checkpoint}" in out
    records = [json.loads(line) for line in progress.read_text().splitlines()[before:]]
    steps = [r["step"] for r in records if r.get("phase") != "Preparing"]
    assert min(steps) == stopped_at + 1  # nothing before the checkpoint was trained again
    trained = [r for r in records if r.get("phase") != "Preparing"]  # an ETA while steps remain, none after the last
    assert all(r["eta"] for r in trained if r["step"] < stopped_at + 5) and trained[-1]["eta"] is None, trained
    summary = json.loads((tmp_path / "logs" / "node-0.result.json").read_text())
    first_run = [json.loads(line) for line in progress.read_text().splitlines()[:before]]
    tokens_at_checkpoint = next(r["tokensSeen"] for r in first_run if r.get("step") == stopped_at)
    assert summary["attemptSteps"] == 5  # the rate counts this attempt's tokens, not the first run's
    assert summary["attemptTokens"] == summary["tokensSeen"] - tokens_at_checkpoint > 0


def finished(proc: subprocess.Popen, workdir: Path, timeout: float) -> str:
    """The CLI's output once it exits; past `timeout`, a failure that shows every node's log (a hang says where)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out = proc.communicate()[0]
        logs = {p.name: p.read_text()[-4000:] for p in sorted((workdir / "logs").glob("node-*.log"))}
        pytest.fail(f"still running after {timeout}s\n{out}\n" + "\n".join(f"--- {n}\n{t}" for n, t in logs.items()))


def test_two_nodes_on_one_machine(tiny_model_dir, tmp_path):
    proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set",
                    "spec.distributed.numNodes=2", "--set", "spec.training.maxSteps=6", "--output", str(tmp_path))
    out = finished(proc, tmp_path, 600)
    assert proc.returncode == 0, out
    assert "2 node(s) x 1 process(es) on this machine" in out
    result = json.loads((tmp_path / "logs" / "node-1.result.json").read_text())
    assert result["worldSize"] == 2 and result["modelWrapper"] == "DistributedDataParallel"


def test_a_node_that_fails_stops_the_others_instead_of_leaving_them_in_the_rendezvous(tiny_model_dir, tmp_path):
    """Node 0 cannot open the rendezvous store (its port is held by something that is not one): node 1 would wait
    torch's whole rendezvous timeout (600 s) for it; the gang is stopped and the first failure reported instead."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(8)  # accepts connections into its backlog and never answers them
        port = squatter.getsockname()[1]
        started = time.monotonic()
        proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set",
                        "spec.distributed.numNodes=2", "--port", str(port), "--output", str(tmp_path))
        out = finished(proc, tmp_path, 300)
    assert proc.returncode not in (0, exit_codes.INTERRUPTED), out
    assert "node 0 exited with" in out and "stopping the other node(s)" in out, out
    assert "address already in use" in (tmp_path / "logs" / "node-0.log").read_text().lower()
    assert time.monotonic() - started < 250


def test_invalid_spec_and_bad_override(tmp_path):
    proc = finetune("run", TINY, "--set", "spec.distributed.numNodes=0", "--output", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.CONFIG_ERROR and "spec.distributed.numNodes" in out  # permanent
    proc = finetune("run", TINY, "--set", "no-equals-sign", "--output", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "expected PATH=VALUE" in out
    assert not Path(tmp_path / "output").exists()  # nothing was started


def test_a_stop_before_training_starts_exits_143_without_a_traceback(tiny_model_dir, tmp_path):
    """Ctrl-C while the model loads or the data is tokenized: nothing to save yet, so a clean Interrupted (143,
    resumable), never exit 1 with a traceback."""
    proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--output", str(tmp_path))
    node_log = tmp_path / "logs" / "node-0.log"
    # The node's launcher has started its trainer, which now loads torch and the libraries it trains with (seconds
    # on any machine): the stop comes before training, however fast or loaded the machine is.
    wait_until("the node's launcher starting its trainer",
               lambda: node_log.exists() and "resolved after" in node_log.read_text(), timeout=600, every=0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    log = node_log.read_text()
    assert proc.returncode == exit_codes.INTERRUPTED, out + log[-3000:]
    assert "Traceback" not in out and "Interrupted (exit 143)" in out
    assert "before training started; nothing to save yet" in out, out + log[-3000:]
    assert not list((tmp_path / "output").glob("checkpoint-*"))


def test_a_run_that_diverges_stops_with_its_own_exit_class_and_names_the_good_checkpoint(tiny_model_dir, tmp_path):
    """The quick start's model fully fine-tuned with learningRate 10 (the loss goes 6 -> thousands): stopped, exit
    79 (never retried), the numbers and the last checkpoint from before the rise in the message; the same spec at
    its own rate succeeds (test above), and so does a noisy batch-1 run (below)."""
    proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set", "spec.method.type=full",
                    "--set", "spec.training.learningRate=10", "--set", "spec.checkpoints.saveSteps=1",
                    "--output", str(tmp_path))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == exit_codes.DIVERGED, out
    summary = json.loads((tmp_path / "logs" / "node-0.result.json").read_text())
    assert summary["reason"] == "LossDiverged"
    assert "the loss diverged: every loss logged from step 2 to 21 (20 optimizer steps, 20 logs) is above 18.4" \
        in summary["message"]
    assert "the last checkpoint before the loss began to rise is" in summary["message"]
    assert "lower spec.training.learningRate" in summary["message"]
    good = summary["message"].split("the last checkpoint before the loss began to rise is ")[1].split(" (verified")[0]
    assert (Path(good) / "FINETUNE_COMPLETE").exists()
    steps = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "output").glob("checkpoint-*"))
    assert steps and max(steps) == int(Path(good).name.split("-")[1])  # nothing saved once the loss rose
    assert "LossDiverged" in out
    # The node's log ends with the clean message, not with torchrun's ChildFailedError traceback.
    last = (tmp_path / "logs" / "node-0.log").read_text().strip().splitlines()[-1]
    assert last.startswith("finetune launch: LossDiverged (exit 79): the loss diverged"), last


def test_a_diverging_run_shorter_than_the_patience_fails_at_its_end_and_saves_no_final_model(tiny_model_dir,
                                                                                                tmp_path):
    """The issue's runs: learning rate 10 for fewer steps than runPolicy.divergence.patience (here 12, logged every
    5: steps 1, 5, 10 and the last) ended "Succeeded: 10 steps, final loss 2348" with those weights saved. Judged at
    the end: exit 79, the reason and numbers in the summary, no final model, no checkpoint of the diverged weights."""
    proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set", "spec.method.type=full",
                    "--set", "spec.training.learningRate=10", "--set", "spec.training.maxSteps=12",
                    "--set", "spec.training.loggingSteps=5", "--set", "spec.checkpoints.saveSteps=1",
                    "--output", str(tmp_path))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == exit_codes.DIVERGED, out
    summary = json.loads((tmp_path / "logs" / "node-0.result.json").read_text())
    assert summary["reason"] == "LossDiverged", summary
    assert "the loss diverged: training ended with the loss above its threshold: every loss logged from step 5 to 12" \
        in summary["message"]
    assert "the final weights are not saved" in summary["message"]
    assert not (tmp_path / "output" / "final").exists()
    records = [json.loads(line) for line in (tmp_path / "output" / "progress.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("loss") is not None] == [1, 5, 10, 12]  # the last step is logged
    # Saves every step, keep 2: steps 3 and 4 were saved before step 5's log showed the rise; they are not "good".
    assert sorted(int(p.name.split("-")[1]) for p in (tmp_path / "output").glob("checkpoint-*")) == [3, 4]
    assert "no checkpoint was saved before the loss began to rise at step 1: the ones saved since (the newest: " \
        f"{tmp_path / 'output' / 'checkpoint-4'}) hold the diverged weights" in summary["message"]


def test_a_noisy_batch_of_one_never_trips_the_divergence_check(tiny_model_dir, tmp_path):
    proc = finetune("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set",
                    "spec.training.perDeviceTrainBatchSize=1", "--set", "spec.training.maxSteps=60",
                    "--set", "spec.training.learningRate=0.01", "--output", str(tmp_path))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "logs" / "node-0.result.json").read_text())
    assert "warnings" not in summary, summary.get("warnings")


def processes_of(workdir: Path) -> list[str]:
    """Every live process whose command line names the run directory (launchers, torchrun, trainers, uploaders)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in text and int(cmdline.parent.name) != os.getpid():
            found.append(f"{cmdline.parent.name}: {text[:200]}")
    return found


def test_nothing_outlives_a_killed_cli_and_a_second_run_on_its_output_is_refused(tiny_model_dir, tmp_path):
    """kill -9 of `finetune run` leaves no launcher, torchrun or trainer running into the same directory (they got
    SIGTERM and stopped with a checkpoint), and while a run lives a second one on its --output is refused at once,
    naming the first."""
    args = ("run", TINY, "--set", f"spec.model.name={tiny_model_dir}", "--set", "spec.training.maxSteps=100000",
            "--output", str(tmp_path))
    first = finetune(*args)
    progress = tmp_path / "output" / "progress.jsonl"
    wait_for_run("3 steps", lambda: progress.exists() and progress.read_text().count('"step"') >= 3, tmp_path,
                 alive=lambda: first.poll() is None)
    second = finetune(*args)
    out, _ = second.communicate(timeout=120)
    assert second.returncode == exit_codes.CONFIG_ERROR, out
    assert f"is in use by another finetune run (pid {first.pid}, started " in out and "another --output" in out, out
    assert first.poll() is None  # the first goes on, untouched

    assert processes_of(tmp_path)  # the nodes of the first run, seen by this very check
    first.kill()  # SIGKILL: no handler runs in the CLI
    first.wait(timeout=30)
    deadline = time.monotonic() + 120
    while processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_of(tmp_path) == []
    assert list((tmp_path / "output").glob("checkpoint-*")), "the nodes stopped gracefully, with a checkpoint"
    third = finetune(*args[:-2], "--set", "spec.training.maxSteps=1", "--output", str(tmp_path))
    out, _ = third.communicate(timeout=600)
    assert "in use by another finetune run" not in out, out  # the lock went with the last node
