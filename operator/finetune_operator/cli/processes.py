"""Process trees: what a container's end does to its processes, for local nodes that are processes; and what keeps
them from outliving `finetune run` or writing beside another run."""

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path


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


def argv_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


AGENT_ARGV = (b"finetune_trainer.agent", b"torch.distributed.run")  # ours, and torchrun's own


def with_argv(pids: list[int], argv: Callable[[int], list[bytes]], words: tuple[bytes, ...] = AGENT_ARGV) -> list[int]:
    """The processes among `pids` whose argv holds one of `words` (those gone meanwhile left out): the agents, and
    the workers they forked (a fork keeps its parent's argv)."""
    found = []
    for pid in pids:
        try:
            if set(words) & set(argv(pid)):
                found.append(pid)
        except OSError:
            continue
    return found


def training_process(pids: list[int], argv: Callable[[int], list[bytes]], parent: Callable[[int], int]) -> int:
    """A training process among a pod's: a child of torchrun's agent (forked from ours, finetune_trainer.agent, so
    with its argv; or started by torchrun's own with the trainer module's)."""
    agents = set(with_argv(pids, argv))
    for pid in pids:
        try:
            if parent(pid) in agents:
                return pid
        except OSError:
            continue
    raise LookupError(f"no training process among {pids}")


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the process that started it dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG); a launcher gets SIGTERM and stops its trainers gracefully, so nothing outlives
    `finetune run`. The parent's pid is taken now: one that died before the child armed it is noticed too."""
    parent = os.getpid()

    def arm() -> None:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig)
        if os.getppid() != parent:
            os._exit(1)
    return arm


class OutputBusy(Exception):
    """Another `finetune run` (or its nodes) writes to the same run directory."""


class OutputLock:
    """An exclusive lock on a run directory for as long as `finetune run` and its nodes live: the nodes inherit
    the descriptor (pass_fds), so the lock outlasts a killed CLI until its nodes have stopped too, and no process
    of a second run writes beside them. flock is released by the kernel when the last holder dies: never stale."""

    FILE = ".finetune-run.lock"

    def __init__(self, workdir: Path):
        import fcntl
        import time

        workdir.mkdir(parents=True, exist_ok=True)
        self.path = workdir / self.FILE
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace").strip() or "{}"
            os.close(self.fd)
            raise OutputBusy(busy_message(workdir, holder)) from None
        self.record = {"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "command": " ".join(sys.argv)}
        self._write()
        os.set_inheritable(self.fd, True)

    def note_nodes(self, pids: list[int]) -> None:
        """The node launchers that hold the lock with this process, for the message a second run gets."""
        self.record["nodes"] = pids
        self._write()

    def _write(self) -> None:
        import json

        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(self.record).encode(), 0)

    def release(self) -> None:
        os.close(self.fd)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def busy_message(workdir: Path, holder: str) -> str:
    """Who holds a run directory and what to do about it. After kill -9 of `finetune run` its nodes hold the lock
    while they stop (they got SIGTERM and save a checkpoint): Ctrl-C of a dead process is no advice."""
    import json

    try:
        record = json.loads(holder)
    except ValueError:
        record = {}
    pid, nodes = record.get("pid"), [n for n in record.get("nodes") or [] if isinstance(n, int) and alive(n)]
    started = f", started {record['started']}" if record.get("started") else ""
    if isinstance(pid, int) and alive(pid):
        return (f"{workdir} is in use by another finetune run (pid {pid}{started}: {record.get('command', '?')}): "
                f"wait for it to end, stop it (Ctrl-C in its terminal, or kill -INT {pid}), or give this run "
                "another --output")
    gone = f"the finetune run that used it (pid {pid}{started}) is gone" if pid else "a finetune run used it"
    if nodes:
        return (f"{workdir} is still in use: {gone}, but its node process(es) {', '.join(map(str, nodes))} still "
                "run: they were told to stop and save a checkpoint, which takes up to a step and a save. Wait for "
                f"them and run this again (it resumes from that checkpoint), or stop them now: kill "
                f"{' '.join(map(str, nodes))}; or give this run another --output")
    return (f"{workdir} is still in use: {gone}, and the processes it started still hold the directory (they stop "
            "after saving a checkpoint). Wait a moment and run this again, or give this run another --output")
