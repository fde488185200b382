"""`finetune run`: a FineTuneJob on this machine, no cluster: the same validation and rendering, one launcher
(torchrun) per node as local processes with the rendezvous on 127.0.0.1, a live progress line, and a summary.

Ctrl-C sends SIGTERM to every node (as a pod deletion would): the trainer finishes its step, saves a checkpoint
and stops; running the same command again resumes from it.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..api import constants as c
from ..api import exit_codes
from ..api.validation import ValidatedJob
from ..render import RenderContext
from ..render.configmap import config_files
from ..render.env import trainer_env
from .ports import free_port
from .processes import OutputBusy, OutputLock, die_with_parent, kill_tree
from .progress import ProgressLine, held_out_preference

POLL_SECONDS = 0.5
# A node that failed leaves the others waiting in a collective or in the rendezvous (torch's default: 600 s). They
# get this long to fail on their own (their reasons are often the telling ones), then a stop as for Ctrl-C, and a
# kill after as long again as a checkpoint may take.
GANG_GRACE_SECONDS = 10.0
GANG_KILL_SECONDS = 120.0


@dataclass
class Node:
    rank: int
    process: subprocess.Popen
    result_file: Path
    log_file: Path
    stop_sent: bool = False  # this process asked the node to stop (Ctrl-C, or the gang stops after a failure)


def visible_gpus(dev: Path = Path("/dev")) -> int:
    """NVIDIA GPUs the trainer processes of this machine could use: the device nodes the driver creates, narrowed
    by CUDA_VISIBLE_DEVICES as CUDA narrows them (no torch import: this runs before anything starts)."""
    devices = [p for p in dev.glob("nvidia[0-9]*") if p.name[len("nvidia"):].isdigit()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(devices)
    listed = [d for d in visible.split(",") if d.strip()]
    # CUDA stops at the first invalid entry (-1 is the usual "none").
    count = next((i for i, d in enumerate(listed) if d.strip().startswith("-")), len(listed))
    return min(count, len(devices))


# What the trainer imports in every run (pyproject's `trainer` extra has them; the image too). Checked by name, without
# importing them (torch alone takes seconds), so a `pip install .` without the extra is told what to install rather
# than seeing a node fail with ModuleNotFoundError.
TRAINER_PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "trl", "matplotlib")
TRAINER_INSTALL = "pip install 'finetunejob[trainer]' (from a checkout: pip install '.[trainer]')"


def missing_trainer_packages(find_spec: Any = None) -> str | None:
    """Why the trainer cannot run here (its packages are not installed), with the fix; None when it can."""
    import importlib.util

    find_spec = find_spec or importlib.util.find_spec
    missing = [name for name in TRAINER_PACKAGES if find_spec(name) is None]
    if not missing:
        return None
    return (f"finetune run trains on this machine with the trainer's packages, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed in {sys.prefix}; fix: {TRAINER_INSTALL}. "
            "finetune validate, render and crd need none of them.")


def gpu_shortfall(job: ValidatedJob, available: int) -> str | None:
    """Why this machine cannot run the job's GPU processes, with the fix; None when it can. A pod gets its GPUs
    from the scheduler, a local run only has this machine's."""
    wanted = job.spec.distributed.gpus_per_node
    if wanted == 0 or wanted <= available:
        return None
    have = f"{available} NVIDIA GPU(s) are visible" if available else "no NVIDIA GPU is visible"
    return (f"1 error(s) in the FineTuneJob for a local run:\n  - spec.distributed.gpusPerNode: {wanted}: each "
            f"node's processes need that many GPUs and on this machine {have}; fix: --set "
            "spec.distributed.gpusPerNode=0 to train on the CPU (with cpuProcessesPerNode processes per node), "
            "or run it on a cluster")


def prepare(job: ValidatedJob, workdir: Path) -> tuple[Path, RenderContext]:
    """Writes the ConfigMap's files under workdir/config, exactly as a pod would see them mounted."""
    ctx = RenderContext(name=job.name, namespace=c.LOCAL_NAMESPACE, config_dir=str(workdir / "config"),
                        output_dir=str(workdir / "output"), cache_dir=str(workdir / "output" / ".cache"),
                        job_labels=job.labels)
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "output").mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    for name, content in config_files(job.spec, ctx).items():
        (workdir / "config" / name).write_text(content)
    return workdir / "config" / "trainer.json", ctx


def node_environment(job: ValidatedJob, ctx: RenderContext, workdir: Path, rank: int, port: int) -> dict[str, str]:
    """The rendered container env; what the downward API would fill in comes from here instead."""
    # No pod here: the rendezvous and in-cluster variables of the shell that runs us must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "KUBERNETES_SERVICE"))}
    env.update({e["name"]: e["value"] for e in trainer_env(job.spec, ctx) if "value" in e})
    env.update({
        c.ENV_PET_NODE_RANK: str(rank), c.ENV_PET_MASTER_ADDR: "127.0.0.1", c.ENV_PET_MASTER_PORT: str(port),
        c.ENV_JOB_NAMESPACE: c.LOCAL_NAMESPACE, c.ENV_POD_NAME: f"{job.name}-local-{rank}",
        c.ENV_ATTEMPT: str(ctx.attempt),
        c.ENV_TERMINATION_LOG: str(workdir / "logs" / f"node-{rank}.result.json"),
        c.ENV_STOP_CAUSE: "Ctrl-C in finetune run (or a SIGTERM sent to it)",  # how stop() reaches the nodes
        c.ENV_NODES_SHARING_CPUS: str(job.spec.distributed.num_nodes),  # one CPU limit for every node here
        # The rendered values point at pod volumes; locally the user's caches serve (a model is downloaded once).
        c.ENV_HF_HOME: (hf_home := os.environ.get(c.ENV_HF_HOME, str(Path.home() / ".cache" / "huggingface"))),
        c.ENV_HF_MODULES_CACHE: os.environ.get(c.ENV_HF_MODULES_CACHE, str(Path(hf_home) / "modules")),
        c.ENV_TORCH_EXTENSIONS_DIR: str(extensions_dir()),
        c.ENV_TRITON_CACHE_DIR: str(workdir / "cache" / "triton"),
    })
    if c.ENV_PET_LOCAL_ADDR in env:  # restarts in place: each node's agent is named by its address, here this host's
        env.update({c.ENV_PET_LOCAL_ADDR: "127.0.0.1", c.ENV_PET_RDZV_ID: f"{job.name}-local"})
    return env


def extensions_dir(prefix: str = sys.prefix) -> Path:
    """Where the nodes' compiled extensions (DeepSpeed's CPU ops) are kept: one directory per Python environment.
    Their build names the environment's paths, so two environments sharing one directory rebuild each other's
    builds (minutes per build) every time they alternate."""
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "finetunejob" / "torch_extensions" / digest


def start_nodes(job: ValidatedJob, workdir: Path, port: int | None = None,
                extra_env: dict[str, str] | None = None, lock: OutputLock | None = None) -> list[Node]:
    """One launcher per node; `extra_env` is laid over each node's environment (tests pin threads, offline hub).
    Each launcher gets SIGTERM when this process dies (even by kill -9) and holds `lock` while it lives."""
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
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(),
                pass_fds=(lock.fd,) if lock is not None else ())
        nodes.append(Node(rank, process, result_file, log_file))
    return nodes


def stop(nodes: list[Node], out: TextIO) -> None:
    print("\nstopping: every node saves a checkpoint at the end of its step (Ctrl-C again to kill)", file=out,
          flush=True)
    for node in nodes:
        if node.process.poll() is None:
            node.stop_sent = True
            node.process.send_signal(signal.SIGTERM)


def wait(nodes: list[Node], progress: ProgressLine, out: TextIO, grace: float = GANG_GRACE_SECONDS,
         kill_after: float = GANG_KILL_SECONDS) -> list[int]:
    """Until every node has exited; the ranks of the nodes that failed, in the order they did. A gang is all or
    nothing (as the operator restarts a whole gang): once one node failed, the others are stopped."""
    interrupted = False
    failed: list[int] = []
    failed_at = stopped_at = None
    killed = False
    while True:
        try:  # the check too: a Ctrl-C lands wherever the loop is, and must always stop the nodes gracefully
            for node in nodes:
                code = node.process.poll()
                if code not in (None, 0) and node.rank not in failed:
                    failed.append(node.rank)
                    failed_at = failed_at or time.monotonic()
            running = [n for n in nodes if n.process.poll() is None]
            if not running:
                break
            if failed_at is not None and stopped_at is None and time.monotonic() - failed_at >= grace:
                stopped_at = time.monotonic()
                first = nodes[failed[0]]
                print(f"\nnode {first.rank} exited with {first.process.returncode}: stopping the other node(s), "
                      "which cannot go on without it", file=out, flush=True)
                for node in running:
                    node.stop_sent = True
                    node.process.send_signal(signal.SIGTERM)
            if stopped_at is not None and not killed and time.monotonic() - stopped_at >= kill_after:
                killed = True
                for node in running:
                    kill_tree(node.process.pid)
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
    return failed


# A node stopped in its first moments, before its launcher installed a handler, dies of the signal itself.
STOP_SIGNALS = (-signal.SIGTERM, -signal.SIGINT)


def died_of_our_stop(node: Node) -> bool:
    return node.stop_sent and node.process.returncode in STOP_SIGNALS


def exit_code(node: Node) -> int:
    """The node's exit code; dying of the stop signal this process sent is the stop it asked for (143)."""
    return exit_codes.INTERRUPTED if died_of_our_stop(node) else node.process.returncode


def results(nodes: list[Node], failed_first: list[int] | None = None) -> tuple[int, dict[str, Any]]:
    """The most telling exit code over the nodes (permanent causes first, then the node that failed first: the
    others were most likely stopped because of it), with that node's summary (node 0's on success)."""
    codes = [exit_code(n) for n in nodes]
    summaries = [json.loads(n.result_file.read_text()) if n.result_file.exists() else {} for n in nodes]
    for node, summary in zip(nodes, summaries, strict=True):
        if not summary and died_of_our_stop(node):
            summary.update(reason=exit_codes.reason(exit_codes.INTERRUPTED),
                           message="stopped while it started, before training: nothing to save yet")
    for code in codes:
        if exit_codes.is_permanent(code):
            return code, next(s for s, c in zip(summaries, codes, strict=True) if c == code)
    order = [*(failed_first or []), *(n.rank for n in nodes)]
    failed = [(codes[rank], summaries[rank]) for rank in order if codes[rank] != 0]
    return failed[0] if failed else (0, summaries[0])


def describe_result(code: int, summary: dict[str, Any], workdir: Path) -> str:
    if code == 0:
        rate = summary.get("tokensPerSecond")
        lines = [f"Succeeded: {summary.get('steps')} steps, final loss {_number(summary.get('finalLoss'))}"
                 + (f", eval loss {_number(summary['evalLoss'])}" if summary.get("evalLoss") is not None else "")
                 + (f" (perplexity {_number(summary['evalPerplexity'])})"
                    if summary.get("evalPerplexity") is not None else "")
                 + held_out_preference(summary)
                 + (f"; stopped early, best checkpoint {summary['bestCheckpoint']}"
                    if summary.get("stoppedEarly") else ""),
                 f"  tokens/s:   {rate:.0f}" if rate else "",
                 f"  model:      {summary.get('model')}",
                 f"  merged:     {summary['merged']}" if summary.get("merged") else "",
                 _uploaded(summary["uploaded"]) if summary.get("uploaded") else "",
                 f"  loss plot:  {summary['lossPlot']}" if summary.get("lossPlot") else "",
                 f"  pushed:     {summary['pushed']['repo']} ({summary['pushed']['commit']})"
                 if summary.get("pushed") else "",
                 *(f"  {name + ':':<11} run {run_id}" for name, run_id in (summary.get("trackerRuns") or {}).items()),
                 *(f"  sample:     {_short(r.get('prompt'))} -> {_short(r.get('completion'))}"
                   for r in summary.get("samples") or []),
                 f"  resumed:    from {summary['resumedFrom']}" if summary.get("resumedFrom") else "",
                 f"  logs:       {workdir / 'logs'}"]
        return "\n".join(line for line in lines if line)
    reason = summary.get("reason") or exit_codes.reason(code)
    hint = " (run the same command again to resume)" if not exit_codes.is_permanent(code) else ""
    return f"{reason} (exit {code}): {summary.get('message', '')}{hint}\n  logs: {workdir / 'logs'}"


def _uploaded(uploaded: dict[str, Any]) -> str:
    """What is in the bucket, and what is not (checkpoints still behind when the run ended)."""
    step = uploaded.get("completeStep")
    line = (f"  uploaded:   {uploaded['uri']} (final/, progress, loss.png"
            + (f", checkpoints up to step {step})" if step is not None else ")"))
    missing = uploaded.get("checkpointsNotUploaded")
    return line + (f"; not uploaded: checkpoint(s) at step {', '.join(map(str, missing))} (kept here)"
                   if missing else "")


def _short(text: Any, limit: int = 60) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def unwritable(workdir: Path, exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(workdir) else ""
    return (f"cannot write the run directory --output {workdir}{where}: {exc.strerror or exc}; give --output a "
            "directory this user can create and write (a path on a local disk, not under a file, /proc or /sys)")


def run(job: ValidatedJob, workdir: Path, out: TextIO | None = None, port: int | None = None,
        take_over: bool = False) -> int:
    out = out or sys.stdout  # looked up per call: a default bound at import keeps whatever stdout was then
    # Explicit handlers: a process started in the background inherits SIGINT as ignored, and `kill` sends SIGTERM;
    # both must still stop the nodes gracefully.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    missing = [e["name"] for e in trainer_env(job.spec, RenderContext(name=job.name, namespace=c.LOCAL_NAMESPACE))
               if "secretKeyRef" in e.get("valueFrom", {}) and not e["valueFrom"]["secretKeyRef"].get("optional")
               and e["name"] not in os.environ]
    for name in missing:  # no Secrets here: the shell's variable of the same name stands in for each
        print(f"warning: {name} comes from a Secret in a cluster; set it in this shell for a local run", file=out)
    shortfall = missing_trainer_packages() or gpu_shortfall(job, visible_gpus())
    if shortfall is not None:
        print(shortfall, file=out, flush=True)
        return exit_codes.CONFIG_ERROR
    try:
        lock = OutputLock(workdir)
    except OutputBusy as exc:
        print(exc, file=out, flush=True)
        return exit_codes.CONFIG_ERROR
    except OSError as exc:  # a path under a file, /proc, /sys, a read-only or full disk: no traceback
        print(unwritable(workdir, exc), file=out, flush=True)
        return exit_codes.CONFIG_ERROR
    try:
        extra = {c.ENV_OUTPUT_TAKE_OVER: "1"} if take_over else None  # outputs/owner.py in the trainer
        try:
            nodes = start_nodes(job, workdir, port, extra_env=extra, lock=lock)
        except OSError as exc:
            print(unwritable(workdir, exc), file=out, flush=True)
            return exit_codes.CONFIG_ERROR
        lock.note_nodes([n.process.pid for n in nodes])
        d = job.spec.distributed
        print(f"{job.name}: {d.num_nodes} node(s) x {d.processes_per_node} process(es) on this machine; "
              f"output in {workdir / 'output'}", file=out, flush=True)
        output = workdir / "output"
        failed = wait(nodes, ProgressLine(output / c.PROGRESS_FILE, out, output / c.NOTICES_FILE), out)
    finally:
        lock.release()
    code, summary = results(nodes, failed)
    print(describe_result(code, summary, workdir), file=out, flush=True)
    return code
