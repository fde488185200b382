"""Layering is enforced, not hoped for: cli | controller -> render -> api, and api/ and render/ import no Kubernetes
client, kopf or torch; the operator runs without transformers (its image does not install it)."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency (requirements/dev.txt)"
    proc = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": f"{ROOT / 'operator'}:{ROOT / 'trainer_image'}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_importing_the_api_and_render_loads_nothing_heavy():
    code = ("import sys, finetune_operator.api, finetune_operator.render, finetune_operator.api.validation;"
            "heavy = {'torch', 'kopf', 'kubernetes', 'transformers', 'deepspeed'} & set(sys.modules);"
            "print(sorted(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT / "operator")})
    assert proc.stdout.strip() == "[]"


def test_the_operator_and_the_cli_load_no_transformers():
    code = ("import sys, finetune_operator.controller.handlers, finetune_operator.cli.main;"
            "print(sorted({'torch', 'transformers', 'deepspeed'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT / "operator")})
    assert proc.stdout.strip() == "[]"
