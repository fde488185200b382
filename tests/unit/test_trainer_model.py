"""Model methods and the status reporter's failure handling (no cluster needed for these)."""

import ssl

import pytest

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.errors import ConfigError
from finetune_trainer.model import apply_method, quantization_config, trainable_parameters
from finetune_trainer.status_report import StatusReporter


def make_spec(**method) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate({
        "model": {"name": "/m", "quantization": method.pop("quantization", "none")},
        "data": {"format": "alpaca", "train": [{"path": "/d"}]}, "method": method})


def test_qlora_on_cpu_is_a_clear_config_error():
    spec = make_spec(type="qlora", quantization="4bit")
    with pytest.raises(ConfigError, match="needs a GPU"):
        quantization_config(spec, use_cpu=True)


def test_freeze_trains_only_the_last_layers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = apply_method(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                         make_spec(type="freeze", freeze={"trainableLayers": 1}))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("model.layers.1.") for n in trainable)


def test_lora_all_linear_freezes_the_base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = apply_method(AutoModelForCausalLM.from_pretrained(tiny_model_dir), make_spec(type="lora"))
    trainable, total = trainable_parameters(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert 0 < trainable < total / 4 and all("lora_" in n for n in names)
    assert any("mlp.down_proj" in n for n in names) and not any("lm_head" in n for n in names)


def test_a_failed_status_report_never_raises():
    reporter = StatusReporter("https://127.0.0.1:9", "token", "ns", "job", ssl.create_default_context(),
                              min_interval=0)
    assert reporter.report({"progress": {"step": 1}}) is False
    assert reporter.failures == 1


def test_status_reports_are_rate_limited():
    reporter = StatusReporter("https://127.0.0.1:9", "token", "ns", "job", ssl.create_default_context(),
                              min_interval=3600)
    reporter.report({"progress": {"step": 1}})
    assert reporter.report({"progress": {"step": 2}}) is False and reporter.failures == 1  # skipped, not sent
    reporter.report({"progress": {"step": 3}}, force=True)
    assert reporter.failures == 2  # the final report is forced through the limit
