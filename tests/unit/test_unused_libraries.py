"""Which optional libraries a job's processes leave out, and that leaving one out makes it look uninstalled."""

import importlib.util
import json
import sys

import pytest

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.unused_libraries import leave_out, unused_libraries


def spec(model="/m", gpus=0, quantization="none", method="lora", **distributed) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate({
        "model": {"name": model, "quantization": quantization},
        "data": {"format": "alpaca", "train": [{"path": "/d"}]}, "method": {"type": method},
        "distributed": {"gpusPerNode": gpus, **distributed}})


def test_a_cpu_lora_job_uses_neither():
    assert unused_libraries(spec()) == ["deepspeed", "bitsandbytes"]


def test_a_deepspeed_job_keeps_deepspeed():
    job = spec(strategy="deepspeed", deepspeed={"zeroStage": 2})
    assert "deepspeed" not in unused_libraries(job) and "bitsandbytes" in unused_libraries(job)


def test_a_gpu_job_keeps_bitsandbytes_quantized_or_not():
    assert unused_libraries(spec(gpus=1)) == ["deepspeed"]
    assert unused_libraries(spec(gpus=1, quantization="4bit", method="qlora")) == ["deepspeed"]


def test_a_checkpoint_saved_quantized_keeps_bitsandbytes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      "quantization_config": {"load_in_4bit": True}}))
    assert "bitsandbytes" not in unused_libraries(spec(model=str(tmp_path)))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "bitsandbytes" in unused_libraries(spec(model=str(tmp_path)))


def test_a_library_left_out_looks_uninstalled_and_one_already_loaded_stays(monkeypatch):
    absent = "email.mime.audio"  # installed, not imported by these tests
    monkeypatch.delitem(sys.modules, absent, raising=False)
    assert importlib.util.find_spec(absent) is not None
    leave_out(["json", absent])
    try:
        assert sys.modules["json"] is json
        assert importlib.util.find_spec(absent) is None  # what transformers, accelerate and peft check
        with pytest.raises(ImportError):
            importlib.import_module(absent)
    finally:
        del sys.modules[absent]
