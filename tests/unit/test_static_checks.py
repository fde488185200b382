"""The linters the README's test command runs: ruff (pyflakes, style, import order, bandit's checks) on the whole
tree, and mypy on the operator (strict on api/ and render/). Configuration: pyproject.toml."""

import subprocess
import sys

from tests.conftest import ROOT


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", name, *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_finds_nothing():
    proc = tool("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing():
    proc = tool("mypy", "--no-incremental")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout
