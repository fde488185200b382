"""Builds the compiled extension DeepSpeed loads for its collectives on CPU (the shared-memory op) into the
directory `finetune run` and the test kubelet give their nodes (one per Python environment: finetune_operator's
cli.local_run.extensions_dir), so the suite's first DeepSpeed case does not compile it (2 minutes on a quiet
machine, 6 on a busy one, inside a test's time limit). Cached: a second run loads the built one in seconds.
Usage: .venv/bin/python hack/build-extensions.py   (hack/test.sh runs it during set-up)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator")]

from finetune_operator.cli.local_run import extensions_dir  # noqa: E402

os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir())

from deepspeed.accelerator import get_accelerator  # noqa: E402

get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)
print(os.environ["TORCH_EXTENSIONS_DIR"])
