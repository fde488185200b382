"""Process trees: what a container's end does to its processes, for local nodes that are processes."""

import os
import signal
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
