"""The pod's command: wait for node 0's DNS name, run torchrun on the trainer, and exit with the trainer's code.

- DNS: headless-Service records appear a moment after the pods; torchrun started before that fails its rendezvous
  (pytorch-operator#333), so the launcher waits (bounded) first.
- Exit code: torchrun reports any worker failure as exit 1, which would erase the contract (config error vs data
  error vs retryable). Each worker writes its result to a directory the launcher owns; the launcher exits with the
  most telling code and writes the summary to the container's termination message.
- torchrun reads PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT from the env the
  operator rendered, so the argv carries no topology.
- Each training process gets its share of the container's CPU limit as OMP_NUM_THREADS (cpu_threads.py), not the
  node's cores.
- A job of one node and one process (CPU jobs, one GPU) runs the trainer without torchrun: its agent has nothing
  to coordinate there, and its start-up cost every attempt seconds of CPU. The trainer gets the same variables.
- Otherwise torchrun's agent runs (agent.py: the same agent, with the trainer's libraries imported once per pod and
  its workers forked, not imported again by each of them and by torchrun itself: 20% less CPU for a 2-node CPU job).
  A fixed gang uses torch's static rendezvous on the master address. An attempt that restarts in place
  (PET_RDZV_BACKEND=c10d): node 0's agent hosts the rendezvous on the master address and port (explicitly: in a test
  kubelet every pod's address is the same), a failed worker is restarted on its pod up to PET_MAX_RESTARTS times,
  and the group re-forms with the nodes that are there (PET_NNODES MIN:MAX for an elastic job).
"""

import argparse
import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes
from finetune_trainer.cpu_threads import cpu_limit, thread_env, usable_cpus
from finetune_trainer.errors import stop_cause

MAX_TERMINATION_MESSAGE = 4000  # the kubelet keeps at most 4096 bytes
STDERR_TAIL_LINES = 60
STOPS: list[int] = []  # stop signals forwarded to the child (a pod deletion, Ctrl-C in `finetune run`)
EXIT_DNS_TIMEOUT = exit_codes.RENDEZVOUS_DNS_TIMEOUT


class DnsTimeout(RuntimeError):
    """Node 0's name never resolved: usually the headless Service or its subdomain is missing."""


@dataclass(frozen=True)
class Child:
    """What the launcher runs: its argv, the variables added to the launcher's environment, and its name in
    messages."""
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    name: str = "torchrun"


def single_process(env: Mapping[str, str]) -> bool:
    """One node of one process: nothing to rendezvous with, and torchrun's agent would only start the trainer and
    wait for it, at the price of its own torch import (~2.5 s of CPU before every attempt's first step). Unless it
    restarts in place: then the agent is what restarts it."""
    return (env.get(c.ENV_PET_NNODES, "1") in ("1", "1:1") and env.get(c.ENV_PET_NPROC_PER_NODE, "1") == "1"
            and not restarts_in_place(env))


def restarts_in_place(env: Mapping[str, str]) -> bool:
    return env.get(c.ENV_PET_RDZV_BACKEND) == c.RDZV_BACKEND_C10D


# How long the agents of an elastic group wait, once minNodes have joined, for more before they start: a lost
# node's survivors re-form after it, so it is part of every shrink; a node that comes later joins by a regrowth.
RDZV_LAST_CALL_SECONDS = 3
# A lost node's agent is taken out of the rendezvous once it missed this many keep-alives of this many seconds
# (torch's defaults, 5 s x 3, add 15 s to every shrink); each agent writes the rendezvous state that often. Not
# fewer than 10 s: torch also sweeps a live agent whose keep-alive is late, and a sweep that lands after a round
# completed leaves the others waiting on it (its rank's key) until read_timeout, or a group below minNodes. With
# 1 s x 3, agents starved of CPU (2 busy cores) were swept mid-rendezvous and a 3-node group stood still 300 s.
# Every 2 s rather than every second: each keep-alive rewrites the state (compare-and-set), and a node joining a
# group under way, starved of CPU, lost its own write to the members' keep-alives round after round (a replacement
# pod on 2 busy cores never got onto the wait list in 3 minutes). A node killed outright is swept sooner
# (presence.py).
RDZV_KEEP_ALIVE_SECONDS = 2
RDZV_KEEP_ALIVE_MISSED = 5
# How long the agents wait for the fewest nodes (a fixed gang's replaced pod, an elastic one's minNodes) to join.
RDZV_JOIN_TIMEOUT_SECONDS = 900
# How long an agent waits for a key another agent writes once a group is formed (its ranks, MASTER_ADDR). torch's
# 60 s default failed every agent of a group on 2 busy cores (load 15-18): one agent, still stopping its workers
# (each saves a checkpoint at its step's end) or starved of CPU, wrote its key after the others gave up, and every
# pod was replaced. A lost agent is noticed by the keep-alives, not by this.
RDZV_READ_TIMEOUT_SECONDS = 300


# The workers' own store, new for every group (its rank 0 hosts it), instead of one the agents share across groups:
# torch keeps a group's keys there, and the next group's gloo would connect to the addresses of the last one's.
TORCH_DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def rendezvous_env(env: Mapping[str, str]) -> dict[str, str]:
    """The c10d rendezvous endpoint (node 0's agent on the master address and port), and who hosts it: node 0
    (by its completion index, not by matching its hostname, which in a test kubelet every pod shares)."""
    if not restarts_in_place(env) or env.get(c.ENV_PET_RDZV_ENDPOINT):
        return {}
    host = "true" if env.get(c.ENV_PET_NODE_RANK, "0") == "0" else "false"
    return {TORCH_DISABLE_SHARED_STORE: "1",
            c.ENV_PET_RDZV_ENDPOINT: f"{env.get(c.ENV_PET_MASTER_ADDR, '127.0.0.1')}:"
                                     f"{env.get(c.ENV_PET_MASTER_PORT, str(c.DEFAULT_RENDEZVOUS_PORT))}",
            c.ENV_PET_RDZV_CONF: f"is_host={host},join_timeout={RDZV_JOIN_TIMEOUT_SECONDS},"
                                 f"read_timeout={RDZV_READ_TIMEOUT_SECONDS},"
                                 f"last_call_timeout={RDZV_LAST_CALL_SECONDS},"
                                 f"keep_alive_interval={RDZV_KEEP_ALIVE_SECONDS},"
                                 f"keep_alive_max_attempt={RDZV_KEEP_ALIVE_MISSED}"}


def worker_command(config: str, env: Mapping[str, str]) -> Child:
    """torchrun's agent with the trainer's libraries imported once and its workers forked (agent.py), or for a
    single process the trainer itself with the variables torchrun would have given its one worker (ranks, world,
    rendezvous address; torch.distributed, accelerate and the Trainer read them)."""
    if not single_process(env):
        return Child([sys.executable, "-m", "finetune_trainer.agent", "--config", config], rendezvous_env(env))
    return Child([sys.executable, "-u", "-m", "finetune_trainer", "--config", config], {
        "RANK": "0", c.ENV_LOCAL_RANK: "0", "WORLD_SIZE": "1", c.ENV_LOCAL_WORLD_SIZE: "1", "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "ROLE_NAME": "default",
        "MASTER_ADDR": env.get(c.ENV_PET_MASTER_ADDR) or "127.0.0.1",
        "MASTER_PORT": env.get(c.ENV_PET_MASTER_PORT) or "29500",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}, "the trainer")


def exit_status(returncode: int) -> int:
    """A child killed by signal N, as a shell and the kubelet report it: 128 + N (137: SIGKILL, e.g. the kernel's
    OOM killer), not Popen's -N, which no exit status can carry."""
    return 128 - returncode if returncode < 0 else returncode


def wait_for_dns(host: str, timeout: float, resolve: Callable[[str], object] = socket.gethostbyname,
                 interval: float = 1.0) -> float:
    """Blocks until `host` resolves; returns the seconds waited or raises DnsTimeout."""
    started = time.monotonic()
    while True:
        try:
            resolve(host)
            return time.monotonic() - started
        except OSError as exc:
            if time.monotonic() - started >= timeout:
                raise DnsTimeout(f"{host} did not resolve within {timeout:.0f}s ({exc}); check that the headless "
                                 "Service exists and the pods' subdomain matches it") from exc
            time.sleep(interval)


def aggregate(results: list[dict], child_code: int, tail: list[str] | None = None,
              child: str = "torchrun", worker_required: bool = False) -> tuple[int, dict]:
    """A permanent code from any worker wins (config > data > diverged), then any failure, then the child's own
    (torchrun's, or the trainer's where it ran without torchrun). `worker_required` (an agent that restarts in
    place): success is a worker's that finished, never the agent's exit alone; an agent that left a closed
    rendezvous without a worker (its node left out of the group that finished) did not train."""
    for code in (exit_codes.CONFIG_ERROR, exit_codes.DATA_ERROR, exit_codes.DIVERGED):
        for result in results:
            if result.get("exitCode") == code:
                return code, result
    for result in results:
        if result.get("exitCode", 0) != 0:
            return int(result["exitCode"]), result
    if child_code != 0:
        why = last_error(tail or [])
        return child_code, {"reason": exit_codes.reason(child_code),
                            "message": f"{child} exited with {child_code}: " + (why or "a worker crashed or was "
                                                                              "killed before reporting")}
    if worker_required and not results:
        return 1, {"reason": exit_codes.reason(1), "message": f"{child} ended without a worker that trained to the "
                   "end: this node was left out of the group (the rendezvous closed before it could join)"}
    ranked = sorted(results, key=lambda r: r.get("worldSize") is None)
    return exit_codes.SUCCESS, ranked[0] if ranked else {"reason": "Succeeded"}


# A Python exception line ("ValueError: ...", "torch.OutOfMemoryError: CUDA out of memory ...") or a fatal signal.
ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt)|RuntimeError|Segmentation fault|Killed)\b.*")


def last_error(lines: list[str]) -> str | None:
    """The line of the workers' output that explains a crash: the last exception line, else the last line."""
    lines = [ln.strip() for ln in lines if ln.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return exit_codes.short(line)
    return exit_codes.short(lines[-1]) if lines else None


def termination_message(summary: dict) -> str:
    """The summary as JSON within the kubelet's 4 KiB: fields dropped and the message shortened at a word, never
    cut mid-JSON (an unparseable message reaches the FineTuneJob as an escaped blob)."""
    text = json.dumps(summary, default=str)
    if len(text) <= MAX_TERMINATION_MESSAGE:
        return text
    kept = {k: summary.get(k) for k in ("exitCode", "reason", "message", "steps", "finalLoss", "memoryEstimate")
            if k in summary}
    limit = MAX_TERMINATION_MESSAGE - len(json.dumps({**kept, "message": ""}, default=str)) - 64
    kept["message"] = exit_codes.short(str(kept.get("message") or ""), max(limit, 80))
    return json.dumps(kept, default=str)


def write_termination_message(summary: dict) -> None:
    path = Path(os.environ.get(c.ENV_TERMINATION_LOG, c.TERMINATION_MESSAGE_PATH))
    text = termination_message(summary)
    try:
        path.write_text(text)
    except OSError:
        pass  # not in a pod (no termination log): the summary is also on stdout


class QuietStop:
    """After a stop we forwarded (a suspend, a pod deletion, Ctrl-C), torchrun's agent re-raises the signal as a
    SignalException with a traceback, in every pod's log, for a stop that went as asked. Such a traceback is replaced
    by one line; any other traceback passes unchanged."""

    def __init__(self) -> None:
        self.held: list[str] = []

    def filter(self, line: str) -> list[str]:
        if self.held:
            self.held.append(line)
            if line.startswith((" ", "\t")):
                return []
            block, self.held = self.held, []
            if "SignalException" in line:
                return [f"finetune launch: torchrun stopped on the forwarded signal {STOPS[0]} (a requested stop)\n"]
            return block
        if STOPS and line.startswith("Traceback (most recent call last)"):
            self.held = [line]
            return []
        return [line]

    def flush(self) -> list[str]:
        block, self.held = self.held, []
        return block


def run_child(argv: list[str], result_dir: Path, tail: collections.deque | None = None,
              extra_env: Mapping[str, str] | None = None) -> int:
    """Runs torchrun (or the single trainer) as a child, forwarding SIGTERM/SIGINT so a pod deletion stops every
    worker cleanly. Its stderr is passed through (the pod log) and its last lines kept in `tail`, to explain a
    crash."""
    env = {**os.environ, **(extra_env or {}), c.ENV_RESULT_DIR: str(result_dir)}
    child = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, errors="replace")

    def relay() -> None:
        assert child.stderr is not None
        quiet = QuietStop()
        for line in child.stderr:
            for kept in quiet.filter(line):
                sys.stderr.write(kept)
            if tail is not None:
                tail.append(line)
        for kept in quiet.flush():
            sys.stderr.write(kept)

    reader = threading.Thread(target=relay, name="stderr", daemon=True)
    reader.start()

    def forward(signum, _frame):
        STOPS.append(signum)
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if STOPS:  # a stop that came while the child was being started (held by main): it is the child's now
            child.send_signal(STOPS[-1])
        code = child.wait()
        reader.join(timeout=10)
        return exit_status(code)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_trainer.launch")
    parser.add_argument("--config", required=True, help="trainer.json mounted from the ConfigMap")
    parser.add_argument("--dns-timeout", type=float, default=600.0, help="seconds to wait for node 0's DNS name")
    args = parser.parse_args(argv)
    master = os.environ.get(c.ENV_PET_MASTER_ADDR)
    if master:
        try:
            waited = wait_for_dns(master, args.dns_timeout)
        except DnsTimeout as exc:
            write_termination_message({"exitCode": EXIT_DNS_TIMEOUT, "reason": exit_codes.reason(EXIT_DNS_TIMEOUT),
                                        "message": str(exc)})
            print(f"finetune launch: {exc}", file=sys.stderr)
            return EXIT_DNS_TIMEOUT
        print(f"finetune launch: {master} resolved after {waited:.1f}s", file=sys.stderr)
    # A stop (Ctrl-C in `finetune run`, a pod's SIGTERM) before the child exists is held, not a KeyboardInterrupt
    # traceback: run_child forwards it as soon as the child is there, and the run ends Interrupted as any stop does.
    held = {s: signal.signal(s, lambda signum, _frame: STOPS.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        child = worker_command(args.config, os.environ)
        child = replace(child, env={**thread_env(os.environ, cpu_limit(), usable_cpus()), **child.env})  # its CPUs
        return supervise(child, worker_required=restarts_in_place(os.environ))
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)


def supervise(child: Child, worker_required: bool) -> int:
    """Runs `child` (torchrun, the agent or the trainer) and exits as the pod: the most telling of its workers'
    results and its own code (aggregate), written to the termination message."""
    with tempfile.TemporaryDirectory(prefix="finetune-results-") as tmp:
        tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
        child_code = run_child(child.argv, Path(tmp), tail, child.env)
        results = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("result-*.json"))]
    code, summary = aggregate(results, child_code, list(tail), child.name, worker_required=worker_required)
    unreported_stop = code == exit_codes.INTERRUPTED and not results  # the trainer died of the forwarded SIGTERM
    if STOPS and (code not in (exit_codes.SUCCESS, exit_codes.INTERRUPTED) or unreported_stop) \
            and not exit_codes.is_permanent(code):
        # Stopped before a worker could report (still importing, loading): a requested stop, not a crash.
        message = f"stopped by {stop_cause(STOPS[0])} before training started; nothing to save yet"
        code, summary = exit_codes.INTERRUPTED, {"reason": exit_codes.reason(exit_codes.INTERRUPTED),
                                                 "message": message}
    write_termination_message({**summary, "exitCode": code})
    if code != exit_codes.SUCCESS:  # after torchrun's ChildFailedError traceback: the last thing a reader sees
        print(f"finetune launch: {summary.get('reason') or exit_codes.reason(code)} (exit {code}): "
              f"{summary.get('message', '')}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
