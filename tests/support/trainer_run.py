"""Run the real trainer the way a pod does, one process per "node" (rendezvous on 127.0.0.1): the same start-up
as `finetune run` (finetune_operator.cli.local_run), with a test environment and a result per node."""

from __future__ import annotations

import json
import os
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
                tails = "\n".join(f"--- node {node.rank} (exit {node.process.poll()}):\n"
                                   f"{node.log_file.read_text(errors='replace')[-3000:]}" for node in nodes)
                raise AssertionError(f"no node wrote anything for {now - quiet_since:.0f} s "
                                     f"({now - started:.0f} s in all):\n{tails}")
            time.sleep(0.5)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                kill_tree(node.process.pid)
    return [NodeResult(node.process.wait(), json.loads(node.result_file.read_text()) if node.result_file.exists()
                       else {}, node.log_file.read_text()) for node in nodes]
