"""Where a test run's time went, from FINETUNE_TEST_TIMELINE's records (tests/conftest.py): each worker's busy
time and its files in the order it ran them, the idle tail (workers done while another still ran), the files that
used the most CPU, the load.
Usage: FINETUNE_TEST_TIMELINE=/tmp/t.jsonl ./hack/test.sh; .venv/bin/python hack/test-timeline.py /tmp/t.jsonl"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(path: Path) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        sys.exit(f"{path}: no records")
    origin = min(r["start"] for r in records)
    end = max(r["end"] for r in records)
    files: dict[tuple[str, str], list[float]] = defaultdict(lambda: [float("inf"), 0.0])
    for r in records:
        span = files[(r["worker"], r["test"].split("::")[0])]
        span[0], span[1] = min(span[0], r["start"] - origin), max(span[1], r["end"] - origin)
    workers: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for (worker, file), (first, last) in files.items():
        workers[worker].append((first, last, file))
    print(f"{len(records)} tests, {end - origin:.0f} s from the first start to the last end")
    for worker in sorted(workers):
        spans = sorted(workers[worker])
        print(f"\n{worker}: ends at {spans[-1][1]:.0f} s, busy {sum(b - a for a, b, _ in spans):.0f} s")
        for first, last, file in spans:
            if last - first >= 20:
                print(f"  {first:6.0f} {last:6.0f} {last - first:5.0f}  {file}")
    failed = [r["test"] for r in records if r.get("outcome") == "failed"]
    print(f"\n{len(failed)} failed" + "".join(f"\n  {test}" for test in failed))
    cpu: dict[str, float] = defaultdict(float)
    for r in records:
        if "cpu" in r:  # older records have none
            cpu[r["test"].split("::")[0]] += r["cpu"]
    if cpu:
        total = sum(cpu.values())
        print(f"\nCPU seconds of the workers and the processes they waited for: {total:.0f} in all; the most:")
        for file, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {seconds:6.0f} {100 * seconds / total:4.1f}%  {file}")
    loads = [r["load"] for r in records]
    print(f"\nload average at test ends: median {sorted(loads)[len(loads) // 2]:.1f}, max {max(loads):.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
