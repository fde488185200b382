"""The start order of test files under pytest-xdist (tests/support/ordering.py) and its recorded durations."""

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.support.ordering import start_order, tier_of


def test_training_and_cluster_files_alternate_in_proportion_longest_first_and_units_last():
    files = {"e2e/a": ("e2e", 300), "e2e/b": ("e2e", 100), "e2e/c": ("e2e", 100), "images/i": ("images", 100),
             "cluster/x": ("cluster", 200), "cluster/y": ("cluster", 100), "unit/u": ("unit", 5),
             "unit/v": ("unit", 50), "other": ("", 1)}
    order = start_order(files)
    # Each kind's share of its own total after each pick: a .5, x .67, b .67, c .83 (a tie goes to training), y 1
    assert order[:6] == ["e2e/a", "cluster/x", "e2e/b", "e2e/c", "cluster/y", "images/i"]
    assert order[6:] == ["unit/v", "unit/u", "other"]
    assert start_order({"cluster/x": ("cluster", 1)}) == ["cluster/x"]
    assert start_order({}) == []


def test_recorded_durations_come_from_a_junit_report(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.unit.test_ordering" name="a" time="1.5"/>'
                      '<testcase classname="tests.unit.test_ordering" name="b" time="2"/>'
                      '<testcase classname="tests.cluster.test_chart.SomeClass" name="c" time="7"/>'
                      '<testcase classname="not.a.file" name="d" time="9"/>'
                      '</testsuite></testsuites>')
    out = tmp_path / "durations.json"
    proc = subprocess.run([sys.executable, str(ROOT / "hack" / "record-test-durations.py"), str(report), str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == {"tests/cluster/test_chart.py": 7, "tests/unit/test_ordering.py": 4}


def test_every_recorded_file_exists():
    recorded = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert all((ROOT / path).is_file() for path in recorded), [p for p in recorded if not (ROOT / p).is_file()]


def test_a_files_tier_is_its_folder_under_tests():
    assert [tier_of(p) for p in ("tests/e2e/test_a.py", "tests/unit/test_b.py", "tests/cluster/sub/test_c.py",
                                 "tests/conftest.py", "tests/support/test_d.py", "benchmarks/e2e/x.py")] == [
        "e2e", "unit", "cluster", "", "", ""]
