"""The GPU kit's switch cases' job specs stay valid between GPU runs (benchmarks/gpu_suite.py SWITCHES): smoke mode
runs some of them on CPU, a GPU run all; each is validated here at the size it runs at, on the GPU and in smoke."""

from pathlib import Path

import pytest

from benchmarks.gpu_cases import GPU_1B, GPU_CASE_SIZES, SMOKE, SWITCHES, job_spec
from benchmarks.gpu_suite import SMOKE_SKIPS
from finetune_operator.api.validation import validate_job

pytestmark = pytest.mark.unit


GPU_ONLY = {"qlora", "fsdp2"}  # SkipCase on CPU: bitsandbytes' 4 bits and FSDP through the Trainer need a GPU


@pytest.mark.parametrize(("case", "gpu"), [(case, gpu) for case in sorted(SWITCHES) for gpu in (True, False)
                                           if gpu or case not in GPU_ONLY])
def test_each_switch_cases_job_is_valid(case, gpu):
    size = GPU_CASE_SIZES.get(case, GPU_1B) if gpu else SMOKE
    doc = job_spec(Path("/models/m"), Path("/data/d.jsonl"), size, gpu, **SWITCHES[case])
    validate_job(doc)  # raises InvalidSpec naming every field that is wrong


def test_every_case_smoke_mode_skips_says_why_and_is_a_case():
    from benchmarks.gpu_cases import CASES

    assert set(SMOKE_SKIPS) <= set(CASES) and all(SMOKE_SKIPS.values())
    # The switches' shared code runs in smoke mode: _switch with the full model's reload and with the adapter's.
    assert not {"gradient_checkpointing", "lora_8b_shaped"} & set(SMOKE_SKIPS)
