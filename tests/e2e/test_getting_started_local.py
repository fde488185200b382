"""docs/getting-started/local-run.md, then docs/tasks/use-the-model.md (which picks up where it ends), run as
written: each ```bash block verbatim, its output compared with the page's (tests/support/doc_commands.py), with the
Hub at a local stand-in serving the pages' model id (tests/e2e/getting_started.py) and taking their push. One
substitution: the quick start's install command is the suite's own environment, which has this checkout installed
(a new environment would download torch's GBs); the test checks the page still says that command."""

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.e2e.getting_started import HUB_MODEL, hub_model  # noqa: F401 - the module fixture, used here
from tests.support import doc_commands
from tests.support.hub_server import StandInHub

PAGE = ROOT / "docs" / "getting-started" / "local-run.md"
USE = ROOT / "docs" / "tasks" / "use-the-model.md"
INSTALL = "pip install '.[trainer]'\n"


def test_the_quick_start_runs_as_written(hub_model, tmp_path):  # noqa: F811 - the fixture
    steps = doc_commands.steps(PAGE)
    assert steps[0].commands == INSTALL, "the page's install step is not the one the suite stands in for"
    # The user's checkout, as the commands see it: its examples, and runs/ written beside them.
    (tmp_path / "checkout").mkdir()
    (tmp_path / "checkout" / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")]),
           "HF_HOME": str(tmp_path / "huggingface"), "HOME": str(tmp_path),
           "HF_USER": "acme", "HF_TOKEN": "hf_write_token"}  # what use-the-model.md asks the reader to set
    with StandInHub(token="hf_write_token") as hub:
        hub.serve_model(HUB_MODEL, hub_model)
        env["HF_ENDPOINT"] = hub.url
        for page, step in [*((PAGE, s) for s in steps[1:]), *((USE, s) for s in doc_commands.steps(USE))]:
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", step.commands], cwd=tmp_path / "checkout",
                                  env=env, capture_output=True, text=True, timeout=600)
            where = f"{page.name}:{step.line}"
            assert proc.returncode == 0, f"{where} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            if step.expected is not None:
                diff = doc_commands.mismatch(step.expected, proc.stdout)
                assert diff is None, f"{where}: {diff}"
    assert f"/{HUB_MODEL}/resolve/" in " ".join(hub.downloads())
    final = tmp_path / "checkout" / "runs" / "tiny-cpu-sft" / "output" / "final"
    pushed = hub.files("acme/tiny-sft")
    assert pushed["adapter_model.safetensors"] == (final / "adapter_model.safetensors").read_bytes()
    assert hub.repos["acme/tiny-sft"].private
