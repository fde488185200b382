"""Run the real trainer the way a pod does: render the ConfigMap files, then start the launcher with the
PET_* environment, one process per "node" (rendezvous on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from finetune_operator.render import RenderContext
from finetune_operator.render.configmap import config_files
from finetune_operator.render.env import trainer_env
from finetune_operator.validation import validate_job
from tests.support.controlplane import ROOT, free_port

# Compiled DeepSpeed CPU ops are cached outside the work tree (the first compile takes about a minute).
TORCH_EXTENSIONS = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetunejob")) / "torch_extensions"


@dataclass
class NodeResult:
    returncode: int
    summary: dict
    log: str


def render_config(doc: dict, workdir: Path) -> Path:
    """Writes trainer.json (and deepspeed.json/fsdp.json) as the ConfigMap would, with local paths."""
    job = validate_job(doc)
    config_dir, output_dir = workdir / "config", workdir / "output"
    config_dir.mkdir(parents=True, exist_ok=True)
    ctx = RenderContext(name=job.name, namespace="default", config_dir=str(config_dir), output_dir=str(output_dir))
    for name, content in config_files(job.spec, ctx).items():
        (config_dir / name).write_text(content)
    return config_dir / "trainer.json"


def node_env(doc: dict, workdir: Path, node_rank: int, port: int) -> dict[str, str]:
    """The rendered container env with the values a pod would get from the downward API filled in locally."""
    job = validate_job(doc)
    ctx = RenderContext(name=job.name, namespace="default", config_dir=str(workdir / "config"),
                        output_dir=str(workdir / "output"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "KUBERNETES_"))}
    for item in trainer_env(job.spec, ctx):
        if "value" in item:
            env[item["name"]] = item["value"]
    env.update({"PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
                "FINETUNE_JOB_NAMESPACE": "default", "HF_HOME": str(workdir / "hf"),
                "FINETUNE_TERMINATION_LOG": str(workdir / f"termination-{node_rank}.log"),
                "TORCH_EXTENSIONS_DIR": str(TORCH_EXTENSIONS), "TRITON_CACHE_DIR": str(workdir / "triton"),
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")])})
    return env


def run_nodes(doc: dict, workdir: Path, timeout: float = 600) -> list[NodeResult]:
    """Starts every node's launcher at once (as an Indexed Job's pods would) and waits for all of them."""
    config = render_config(doc, workdir)
    nodes = validate_job(doc).spec.distributed.num_nodes
    port = free_port()
    procs = []
    for rank in range(nodes):
        log = open(workdir / f"node-{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "finetune_trainer.launch", "--config", str(config), "--dns-timeout", "10"],
            env=node_env(doc, workdir, rank, port), stdout=log, stderr=subprocess.STDOUT), log))
    results = []
    for rank, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        termination = workdir / f"termination-{rank}.log"
        summary = json.loads(termination.read_text()) if termination.exists() else {}
        results.append(NodeResult(code, summary, (workdir / f"node-{rank}.log").read_text()))
    return results
