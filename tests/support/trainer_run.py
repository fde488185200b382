"""Run the real trainer the way a pod does, one process per "node" (rendezvous on 127.0.0.1): the same start-up
as `finetune run` (finetune_operator.cli.local_run), with a test environment and a result per node."""

from __future__ import annotations

import json
import os
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


def run_nodes(doc: dict, workdir: Path, timeout: float = 600) -> list[NodeResult]:
    """Starts every node's launcher at once (as an Indexed Job's pods would) and waits for all of them."""
    nodes = start_nodes(validate_job(doc), workdir, extra_env=TEST_ENV)
    results = []
    for node in nodes:
        try:
            code = node.process.wait(timeout=timeout)
        finally:
            if node.process.poll() is None:
                kill_tree(node.process.pid)
        summary = json.loads(node.result_file.read_text()) if node.result_file.exists() else {}
        results.append(NodeResult(code, summary, node.log_file.read_text()))
    return results
