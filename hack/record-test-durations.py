"""Writes tests/durations.json from a full run's JUnit report or timeline (FINETUNE_TEST_TIMELINE, .jsonl): the
seconds each test file took (setup, call and teardown of its cases). tests/conftest.py starts the longest files
first under pytest-xdist, so the last minutes run short files on every worker instead of one long file alone.
Usage: .venv/bin/python hack/record-test-durations.py REPORT.xml|TIMELINE.jsonl [OUT]
  (from ./hack/test.sh --junitxml=REPORT.xml, or FINETUNE_TEST_TIMELINE=TIMELINE.jsonl ./hack/test.sh)"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def test_file(classname: str) -> str | None:
    """tests.e2e.test_x or tests.e2e.test_x.SomeClass -> tests/e2e/test_x.py (the longest prefix that is a file)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    return None


def main(report: Path, out: Path = OUT) -> None:
    seconds: dict[str, float] = defaultdict(float)
    if report.suffix == ".jsonl":
        for line in report.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                path = record["test"].split("::")[0]
                if (ROOT / path).is_file():
                    seconds[path] += record["end"] - record["start"]
    else:
        for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - our own pytest run's report
            path = test_file(case.get("classname", ""))
            if path is not None:
                seconds[path] += float(case.get("time", 0))
    out.write_text(json.dumps({p: round(s) for p, s in sorted(seconds.items())}, indent=1) + "\n")
    print(f"{out}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*map(Path, sys.argv[1:]))
