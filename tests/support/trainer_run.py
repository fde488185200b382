"""Run the real trainer the way a pod does, one process per "node" (rendezvous on 127.0.0.1): the same start-up
as `finetune run` (finetune_operator.cli.local_run), with a test environment and a result per node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from finetune_operator.api.validation import validate_job
from finetune_operator.cli.local_run import start_nodes
from finetune_operator.cli.processes import kill_tree
from tests.support.controlplane import ROOT
from tests.support.polling import wait_while_progressing

# One thread per process on a 2-core machine, no hub access, and this checkout's packages on the path.
TEST_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")])}
# What a trainer process loads only once it trains (~5 s of CPU): a refusal must come before them.
HEAVY_LIBRARIES = ("torch", "transformers", "datasets", "peft")


def trainer_loads(config: Path, env: dict[str, str]) -> tuple[int, list[str], str]:
    """Runs the trainer on `config` in a process of its own: its exit code, which of HEAVY_LIBRARIES it had loaded
    when it ended, and its output."""
    probe = ("import sys; from finetune_trainer import main; code = main.main(['--config', sys.argv[1]]); "
             f"print('LOADED', [m for m in {HEAVY_LIBRARIES!r} if m in sys.modules]); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe, str(config)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, **TEST_ENV, **env})
    loaded = next((line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("LOADED ")), None)
    return proc.returncode, json.loads(loaded.replace("'", '"')) if loaded else list(HEAVY_LIBRARIES), (
        proc.stdout + proc.stderr)


@dataclass
class NodeResult:
    returncode: int
    summary: dict
    log: str


def run_nodes(doc: dict, workdir: Path, stall: float = 480, limit: float = 1800) -> list[NodeResult]:
    """Starts every node's launcher at once (as an Indexed Job's pods would) and waits for all of them, for as long
    as they make progress: a loaded machine makes a run slow, not silent. No node log growing for `stall` seconds
    (or `limit` in all) fails with every node's log tail, so a hang says where it hung."""
    nodes = start_nodes(validate_job(doc), workdir, extra_env=TEST_ENV)
    try:
        wait_while_progressing(lambda: all(node.process.poll() is not None for node in nodes),
                               lambda: logged(nodes), stall, limit, lambda: node_tails(nodes))
    finally:
        for node in nodes:
            if node.process.poll() is None:
                kill_tree(node.process.pid)
    return [NodeResult(node.process.wait(), json.loads(node.result_file.read_text()) if node.result_file.exists()
                       else {}, node.log_file.read_text()) for node in nodes]


def progress_records(workdir: Path) -> list[dict]:
    """The training steps logged in workdir/output/progress.jsonl (each with its loss)."""
    path = workdir / "output" / "progress.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("step") and r.get("loss") is not None]


def logged(nodes: list) -> int:
    """The bytes the nodes have logged so far."""
    return sum(node.log_file.stat().st_size for node in nodes if node.log_file.exists())


def node_tails(nodes: list, chars: int = 3000) -> str:
    return "\n".join(f"--- node {node.rank} (exit {node.process.poll()}):\n"
                     f"{node.log_file.read_text(errors='replace')[-chars:]}" for node in nodes)


def kill_gang_after_a_checkpoint(doc: dict, workdir: Path, stall: float = 480, limit: float = 600) -> tuple[int, int]:
    """Starts the job's nodes and kills the whole gang (frozen with SIGSTOP first, so no node outlives another, then
    SIGKILL, every process of every node) once a checkpoint is complete and a later step is logged: a crash that
    leaves a checkpoint to resume and a step past it to redo. Which checkpoint that is depends on how fast the
    machine runs (a poll can come steps late): the newest complete one after the kill is what a resume must pick.
    Returns (that checkpoint's step, the newest step the killed run logged). Fails with the nodes' log tails when
    they exit first or no node writes for `stall` seconds (a loaded machine makes the run slow, not silent)."""
    from finetune_trainer.outputs import checkpoints

    output = workdir / "output"
    nodes = start_nodes(validate_job(doc), workdir, extra_env=TEST_ENV)

    def past_a_checkpoint() -> bool:
        complete = checkpoints.newest_complete(output)
        step = checkpoints.step_of(complete) if complete is not None else None
        if step is not None and any(r["step"] > step for r in progress_records(workdir)):
            return True
        assert all(n.process.poll() is None for n in nodes), \
            f"a node ended before a checkpoint and a step after it:\n{node_tails(nodes)}"
        return False

    try:
        wait_while_progressing(past_a_checkpoint, lambda: logged(nodes), stall, limit, lambda: node_tails(nodes),
                               every=0.02)
    finally:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for n in nodes:
                kill_tree(n.process.pid, sig)
        for n in nodes:
            n.process.wait()
    complete = checkpoints.newest_complete(output)
    listing = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    assert complete is not None, f"no complete checkpoint after the kill: {listing}\n{node_tails(nodes)}"
    return checkpoints.step_of(complete) or 0, max(r["step"] for r in progress_records(workdir))


def assert_a_killed_gang_resumes_without_redoing_a_step(doc: dict, workdir: Path, same: tuple[str, ...]) -> dict:
    """Kills the job's gang past a checkpoint (kill_gang_after_a_checkpoint), runs it again, and checks that the
    second run resumed the newest complete checkpoint, ran every step after it once, and that each step the killed
    run had logged past it came out the same (the `same` values of its progress record, to 1e-4: weights, optimizer
    states, data order, scheduler and RNG all restored). Returns the second run's summary."""
    max_steps = doc["spec"]["training"]["maxSteps"]
    checkpoint, last_logged = kill_gang_after_a_checkpoint(doc, workdir)
    killed = {r["step"]: r for r in progress_records(workdir)}
    assert last_logged < max_steps  # the kill came before the end

    results = run_nodes(doc, workdir)
    assert all(r.returncode == 0 for r in results), results[0].log[-3000:]
    summary = results[0].summary
    resumed_at = int(summary["resumedFrom"].rsplit("-", 1)[1])
    assert resumed_at == checkpoint  # the newest complete checkpoint
    assert summary["steps"] == max_steps and summary["attemptSteps"] == max_steps - resumed_at
    second = [r for r in progress_records(workdir) if r["startStep"] == resumed_at]
    assert [r["step"] for r in second] == list(range(resumed_at + 1, max_steps + 1))  # no step redone or skipped
    again = [r for r in second if r["step"] in killed]
    assert again or resumed_at >= last_logged
    for r in again:
        before = killed[r["step"]]
        for key in same:
            assert abs(r[key] - before[key]) < 1e-4, (r["step"], key, r[key], before[key])
    return summary
