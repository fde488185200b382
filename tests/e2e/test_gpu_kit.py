"""The GPU kit cannot rot between GPU runs: the carry downloads, fits 60 MiB and installs without an index into a
fresh target for Python 3.12 (the GPU machine's); the suite's smoke mode runs every case on CPU except those
benchmarks/gpu_suite.py's SMOKE_SKIPS names and those that need a GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.polling import tree_bytes, wait_while_progressing


def test_the_carry_fits_and_installs_offline_for_python_312(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "hack" / "gpu-wheels.sh"), str(tmp_path / "carry")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    files = sorted((tmp_path / "carry").iterdir())
    assert sum(f.stat().st_size for f in files) <= 60 * 2**20
    wheels = [str(f) for f in files if f.suffix == ".whl"]
    sdists = [f.name for f in files if f.name.endswith(".tar.gz")]
    assert sdists == [n for n in sdists if n.startswith("deepspeed-")] and len(sdists) == 1  # built on the machine
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--no-index", "--no-deps", "--target", str(tmp_path / "site"), "--python-version",
                              "3.12", "--only-binary=:all:", *wheels], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    for package in ("pydantic", "datasets", "transformers", "peft", "trl", "liger_kernel"):
        assert (tmp_path / "site" / package).is_dir(), package


def run_suite(args: list[str], log: Path, stall: float = 600, limit: float = 3400) -> tuple[int, str]:
    """The suite, waited for while it makes progress: a busy machine makes each case slow, not silent. Progress is
    its output and what its cases write beside the log (their runs' logs, progress and models: a case reports only
    when it ends, after minutes at load 20). Nothing new for `stall` seconds (or `limit` in all) fails with the
    output so far."""
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), *args], stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        try:
            wait_while_progressing(lambda: proc.poll() is not None,
                                   lambda: (log.stat().st_size, tree_bytes(log.parent)), stall, limit,
                                   lambda: log.read_text()[-3000:], every=1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return proc.returncode, log.read_text()


@pytest.mark.timeout(3600)
def test_the_suite_runs_every_case_in_smoke_mode(tmp_path):
    rc, output = run_suite(["--smoke", "--out", str(tmp_path)], tmp_path / "suite.log")
    assert rc == 0, output[-6000:]
    results = {r["case"]: r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    ran = {"ours", "hf_trainer", "trl", "gradient_checkpointing", "lora_8b_shaped", "grpo", "in_place_restart"}
    assert {n for n, r in results.items() if r["status"] == "ok"} == ran, {n: r.get("error") for n, r in
                                                                            results.items()}
    assert all(r["status"] == "skipped" and r["why"] for n, r in results.items() if n not in ran)
    assert results["ours"]["figures"]["tokensPerSecondPerGpu"] > 0 and results["ours"]["figures"]["loss"] > 0
    assert 0 < results["ours"]["figures"]["secondsToFirstStep"] < 120
    # The memory fit estimate of the very job each case ran (compared with the device's peak once one is lent).
    assert results["ours"]["figures"]["predictedPeakGiB"] > 0
    assert results["lora_8b_shaped"]["figures"]["predictedPeakGiB"] > 0
    grpo = results["grpo"]["figures"]  # our GRPO and TRL's GRPOTrainer called directly, the same run
    assert grpo["secondsPerStep"] > 0 and grpo["vsTrl"] > 0 and grpo["sameRunAsTrl"] and grpo["predictedPeakGiB"] > 0
    restart = results["in_place_restart"]["figures"]  # the killed worker's group re-formed from checkpoint 2
    assert "killed" in restart["cause"] and restart["resumedStep"] >= 2 and restart["recoverySeconds"] > 0
    table = (tmp_path / "results.md").read_text()
    assert "| ours | ok |" in table and "MFU >= 50%" in table
