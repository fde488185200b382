"""`finetune run`: a FineTuneJob on this machine, no cluster: the same validation and rendering, one launcher
(torchrun) per node as local processes with the rendezvous on 127.0.0.1, a live progress line, and a summary.

Ctrl-C sends SIGTERM to every node (as a pod deletion would): the trainer finishes its step, saves a checkpoint
and stops; running the same command again resumes from it.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .api import exit_codes
from .api.constants import ENV_PET_MASTER_ADDR, ENV_PET_MASTER_PORT, ENV_PET_NODE_RANK
from .render import RenderContext
from .render.configmap import config_files
from .render.env import trainer_env
from .validation import ValidatedJob

PROGRESS_FILE = "progress.jsonl"
POLL_SECONDS = 0.5


@dataclass
class Node:
    rank: int
    process: subprocess.Popen
    result_file: Path
    log_file: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(job: ValidatedJob, workdir: Path) -> tuple[Path, RenderContext]:
    """Writes the ConfigMap's files under workdir/config, exactly as a pod would see them mounted."""
    ctx = RenderContext(name=job.name, namespace="local", config_dir=str(workdir / "config"),
                        output_dir=str(workdir / "output"), job_labels=job.labels)
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "output").mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    for name, content in config_files(job.spec, ctx).items():
        (workdir / "config" / name).write_text(content)
    return workdir / "config" / "trainer.json", ctx


def node_environment(job: ValidatedJob, ctx: RenderContext, workdir: Path, rank: int, port: int) -> dict[str, str]:
    """The rendered container env; what the downward API would fill in comes from here instead."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "KUBERNETES_SERVICE"))}
    env.update({e["name"]: e["value"] for e in trainer_env(job.spec, ctx) if "value" in e})
    env.update({
        ENV_PET_NODE_RANK: str(rank), ENV_PET_MASTER_ADDR: "127.0.0.1", ENV_PET_MASTER_PORT: str(port),
        "FINETUNE_JOB_NAMESPACE": "local", "FINETUNE_POD_NAME": f"{job.name}-local-{rank}",
        "FINETUNE_TERMINATION_LOG": str(workdir / "logs" / f"node-{rank}.result.json"),
        # The rendered values point at pod volumes; locally everything lives under the run directory.
        "HF_HOME": env.get("HF_HOME_LOCAL", str(Path.home() / ".cache" / "huggingface")),
        "TORCH_EXTENSIONS_DIR": str(Path.home() / ".cache" / "finetunejob" / "torch_extensions"),
        "TRITON_CACHE_DIR": str(workdir / "cache" / "triton"),
    })
    return env


def start_nodes(job: ValidatedJob, workdir: Path, port: int | None = None,
                extra_env: dict[str, str] | None = None) -> list[Node]:
    """One launcher per node; `extra_env` is laid over each node's environment (tests pin threads, offline hub)."""
    config, ctx = prepare(job, workdir)
    port = port or free_port()
    nodes = []
    for rank in range(job.spec.distributed.num_nodes):
        log_file = workdir / "logs" / f"node-{rank}.log"
        result_file = workdir / "logs" / f"node-{rank}.result.json"
        result_file.unlink(missing_ok=True)
        with log_file.open("ab") as log:
            # A session of its own: the terminal's Ctrl-C reaches only `finetune run`, which stops nodes gracefully.
            process = subprocess.Popen(
                [sys.executable, "-m", "finetune_trainer.launch", "--config", str(config), "--dns-timeout", "30"],
                env={**node_environment(job, ctx, workdir, rank, port), **(extra_env or {})}, stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True)
        nodes.append(Node(rank, process, result_file, log_file))
    return nodes


class ProgressLine:
    """Follows progress.jsonl and draws one line (a bar on a terminal, a line per record otherwise)."""

    def __init__(self, path: Path, out: TextIO):
        self.path, self.out = path, out
        self.offset = path.stat().st_size if path.exists() else 0  # only this run's records
        self.last: dict[str, Any] | None = None
        self.tty = out.isatty()

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as f:
            f.seek(self.offset)
            lines = f.readlines()
            self.offset = f.tell()
        for line in lines:
            if line.endswith("\n"):
                self.last = json.loads(line)
                if not self.tty:
                    print(render_progress(self.last), file=self.out, flush=True)
        if self.tty and self.last is not None:
            print("\r" + render_progress(self.last), end="", file=self.out, flush=True)

    def close(self) -> None:
        if self.tty and self.last is not None:
            print(file=self.out)


def render_progress(r: dict[str, Any], width: int = 24) -> str:
    step, total = r.get("step", 0), r.get("maxSteps") or 0
    done = int(width * step / total) if total else 0
    parts = [f"[{'#' * done}{'.' * (width - done)}] {step}/{total}"]
    if r.get("loss") is not None:
        parts.append(f"loss {r['loss']:.4f}")
    if r.get("learningRate") is not None:
        parts.append(f"lr {r['learningRate']:.2e}")
    if r.get("tokensPerSecond"):
        parts.append(f"{r['tokensPerSecond']:.0f} tok/s")
    if r.get("mfu") is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    if r.get("peakMemoryGiB") is not None:
        parts.append(f"{r['peakMemoryGiB']:.1f} GiB")
    if r.get("eta"):
        parts.append(f"ETA {r['eta']}")
    return "  ".join(parts)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc): torchrun puts its workers in sessions of their own, so neither
    killing the launcher nor its process group reaches them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signals a process and everything below it, leaves first (what a container's end does to its processes)."""
    for target in [*reversed(descendants(pid)), pid]:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass


def stop(nodes: list[Node], out: TextIO) -> None:
    print("\nstopping: every node saves a checkpoint at the end of its step (Ctrl-C again to kill)", file=out,
          flush=True)
    for node in nodes:
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)


def wait(nodes: list[Node], progress: ProgressLine, out: TextIO) -> None:
    interrupted = False
    while any(n.process.poll() is None for n in nodes):
        try:
            progress.poll()
            time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            if interrupted:
                for node in nodes:
                    kill_tree(node.process.pid)
            else:
                interrupted = True
                stop(nodes, out)
    progress.poll()
    progress.close()


def results(nodes: list[Node]) -> tuple[int, dict[str, Any]]:
    """The most telling exit code over the nodes (permanent causes first), with node 0's summary."""
    codes = [n.process.returncode for n in nodes]
    summaries = [json.loads(n.result_file.read_text()) if n.result_file.exists() else {} for n in nodes]
    for code in codes:
        if exit_codes.is_permanent(code):
            return code, next(s for s, c in zip(summaries, codes, strict=True) if c == code)
    failed = [(c, s) for c, s in zip(codes, summaries, strict=True) if c != 0]
    return failed[0] if failed else (0, summaries[0])


def describe_result(code: int, summary: dict[str, Any], workdir: Path) -> str:
    if code == 0:
        rate = summary.get("tokensSeen", 0) / summary["trainRuntimeSeconds"] if summary.get(
            "trainRuntimeSeconds") else None
        lines = [f"Succeeded: {summary.get('steps')} steps, final loss {summary.get('finalLoss')}",
                 f"  tokens/s:   {rate:.0f}" if rate else "",
                 f"  model:      {summary.get('model')}",
                 f"  merged:     {summary['merged']}" if summary.get("merged") else "",
                 f"  resumed:    from {summary['resumedFrom']}" if summary.get("resumedFrom") else "",
                 f"  logs:       {workdir / 'logs'}"]
        return "\n".join(line for line in lines if line)
    reason = summary.get("reason") or exit_codes.reason(code)
    hint = " (run the same command again to resume)" if not exit_codes.is_permanent(code) else ""
    return f"{reason} (exit {code}): {summary.get('message', '')}{hint}\n  logs: {workdir / 'logs'}"


def run(job: ValidatedJob, workdir: Path, out: TextIO = sys.stdout, port: int | None = None) -> int:
    # Explicit handlers: a process started in the background inherits SIGINT as ignored, and `kill` sends SIGTERM;
    # both must still stop the nodes gracefully.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    nodes = start_nodes(job, workdir, port)
    d = job.spec.distributed
    print(f"{job.name}: {d.num_nodes} node(s) x {d.processes_per_node} process(es) on this machine; "
          f"output in {workdir / 'output'}", file=out, flush=True)
    wait(nodes, ProgressLine(workdir / "output" / PROGRESS_FILE, out), out)
    code, summary = results(nodes)
    print(describe_result(code, summary, workdir), file=out, flush=True)
    return code
