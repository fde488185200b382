"""Run the real trainer the way a pod does, one process per "node" (rendezvous on 127.0.0.1): the same start-up
as `finetune run` (finetune_operator.cli.local_run), with a test environment and a result per node."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from finetune_operator.api.validation import validate_job
from finetune_operator.cli.local_run import start_nodes
from finetune_operator.cli.processes import kill_tree
from tests.support.controlplane import ROOT

# One thread per process on a 2-core machine, no hub access, and this checkout's packages on the path.
TEST_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")])}


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
        started = quiet_since = time.monotonic()
        written = -1
        while any(node.process.poll() is None for node in nodes):
            now = time.monotonic()
            size = sum(node.log_file.stat().st_size for node in nodes if node.log_file.exists())
            if size != written:
                written, quiet_since = size, now
            if now - quiet_since > stall or now - started > limit:
                raise AssertionError(f"no node wrote anything for {now - quiet_since:.0f} s "
                                     f"({now - started:.0f} s in all):\n{node_tails(nodes)}")
            time.sleep(0.5)
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


def node_tails(nodes: list, chars: int = 3000) -> str:
    return "\n".join(f"--- node {node.rank} (exit {node.process.poll()}):\n"
                     f"{node.log_file.read_text(errors='replace')[-chars:]}" for node in nodes)


def kill_gang_after_a_checkpoint(doc: dict, workdir: Path, stall: float = 480) -> tuple[int, int]:
    """Starts the job's nodes and kills the whole gang (frozen with SIGSTOP first, so no node outlives another, then
    SIGKILL, every process of every node) once a checkpoint is complete and a later step is logged: a crash that
    leaves a checkpoint to resume and a step past it to redo. Which checkpoint that is depends on how fast the
    machine runs (a poll can come steps late): the newest complete one after the kill is what a resume must pick.
    Returns (that checkpoint's step, the newest step the killed run logged). Fails with the nodes' log tails when
    they exit first or no node writes for `stall` seconds (a loaded machine makes the run slow, not silent)."""
    from finetune_trainer.outputs import checkpoints

    output = workdir / "output"
    nodes = start_nodes(validate_job(doc), workdir, extra_env=TEST_ENV)
    try:
        started = quiet_since = time.monotonic()
        written = -1
        while True:
            complete = checkpoints.newest_complete(output)
            step = checkpoints.step_of(complete) if complete is not None else None
            if step is not None and any(r["step"] > step for r in progress_records(workdir)):
                break
            assert all(n.process.poll() is None for n in nodes), \
                f"a node ended before a checkpoint and a step after it:\n{node_tails(nodes)}"
            size = sum(n.log_file.stat().st_size for n in nodes if n.log_file.exists())
            now = time.monotonic()
            if size != written:
                written, quiet_since = size, now
            assert now - quiet_since < stall, (f"no node wrote anything for {now - quiet_since:.0f} s "
                                               f"({now - started:.0f} s in all):\n{node_tails(nodes)}")
            time.sleep(0.02)
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
