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
        import json
        import time

        workdir.mkdir(parents=True, exist_ok=True)
        self.path = workdir / self.FILE
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace").strip() or "{}"
            os.close(self.fd)
            raise OutputBusy(f"{workdir} is in use by another finetune run ({holder}): wait for it to end or stop "
                             "it (Ctrl-C), or give this run another --output") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                       "command": " ".join(sys.argv)}).encode(), 0)
        os.set_inheritable(self.fd, True)

    def release(self) -> None:
        os.close(self.fd)
