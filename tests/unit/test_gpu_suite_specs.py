"""The GPU kit's job specs stay valid between GPU runs: smoke mode skips the switch cases that are case_ours with a
spec field of their own (benchmarks/gpu_suite.py SMOKE_SKIPS), so their fields are checked here, at both sizes."""

from pathlib import Path

import pytest

from benchmarks.gpu_suite import GPU_1B, SMOKE, SMOKE_SKIPS, SWITCHES, job_spec
from finetune_operator.api.validation import validate_job

pytestmark = pytest.mark.unit


GPU_ONLY = {"qlora", "fsdp2"}  # SkipCase on CPU: bitsandbytes' 4 bits and FSDP through the Trainer need a GPU


@pytest.mark.parametrize(("case", "gpu"), [(case, gpu) for case in sorted(SWITCHES) for gpu in (True, False)
                                           if gpu or case not in GPU_ONLY])
def test_each_switch_cases_job_is_valid(case, gpu):
    doc = job_spec(Path("/models/m"), Path("/data/d.jsonl"), GPU_1B if gpu else SMOKE, gpu, **SWITCHES[case])
    validate_job(doc)  # raises InvalidSpec naming every field that is wrong


def test_every_case_smoke_mode_skips_says_why_and_is_a_case():
    from benchmarks.gpu_suite import CASES

    assert set(SMOKE_SKIPS) <= set(CASES) and all(SMOKE_SKIPS.values())
    assert "lora_8b_shaped" not in SMOKE_SKIPS  # the switches' shared code (_switch, reload) runs in smoke mode
