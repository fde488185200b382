"""Model methods and the status reporter's failure handling (no cluster needed for these)."""

import ssl

import pytest

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.errors import ConfigError
from finetune_trainer.outputs.status_report import StatusReporter
from finetune_trainer.training.model import apply_method, quantization_config, trainable_parameters


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


@pytest.mark.parametrize("method", ["freeze", "lora"])
def test_a_reward_models_new_score_head_is_always_trained(method, tiny_model_dir):
    """objective reward: the one-output head is new (seeded, not pretrained), so freeze trains it beside the last
    layers and LoRA (peft's SEQ_CLS task) trains and saves it with the adapter."""
    from finetune_trainer.training.model import model_class

    spec = FineTuneJobSpec.model_validate({
        "model": {"name": "/m"}, "data": {"format": "preference", "train": [{"path": "/d"}]},
        "method": {"type": method, "objective": "reward", "freeze": {"trainableLayers": 1}}})
    cls, extra = model_class(spec)
    model = apply_method(cls.from_pretrained(tiny_model_dir, **extra), spec)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert model.config.num_labels == 1 and any(n.split(".")[-2] == "score" or ".score." in n for n in trainable)
    if method == "freeze":
        assert trainable == {"score.weight"} | {n for n in trainable if n.startswith("model.layers.1.")}
    else:
        assert all("lora_" in n or "score" in n for n in trainable)


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


def test_a_gpu_job_that_sees_no_gpu_says_whether_the_image_or_the_node_is_at_fault(monkeypatch):
    """Before TrainingArguments' "bf16/gpu ... assign use_cpu", which names no field of the spec: a CPU torch is the
    image's fault (permanent, 78), a CUDA torch without a device the node's (retryable, another node may serve)."""
    import torch

    from finetune_operator.api import exit_codes
    from finetune_trainer.errors import ConfigError, NoGPUVisible
    from finetune_trainer.main import require_gpus

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    require_gpus(0)  # a CPU job needs none
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match="gpusPerNode is 8 but this image's torch .* is a CPU build"):
        require_gpus(8)
    monkeypatch.setattr(torch.version, "cuda", "13.2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(NoGPUVisible, match=r"torch \(CUDA 13.2\) sees no GPU \(CUDA_VISIBLE_DEVICES=''\)") as caught:
        require_gpus(8)
    assert not exit_codes.is_permanent(caught.value.exit_code)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    require_gpus(8)


@pytest.mark.parametrize("field", ["name", "tokenizer"])
def test_a_local_model_path_that_does_not_exist_says_so_not_the_hubs_repo_id_text(field, tmp_path):
    from finetune_trainer.training.model import load_tokenizer

    missing = str(tmp_path / "models" / "llama")
    spec = FineTuneJobSpec.model_validate({"model": {"name": missing if field == "name" else "/m",
                                                     **({"tokenizer": missing} if field == "tokenizer" else {})},
                                           "data": {"format": "alpaca", "train": [{"path": "/d"}]}})
    with pytest.raises(ConfigError) as raised:
        load_tokenizer(spec)
    text = str(raised.value)
    assert f"spec.model.{field} is {missing}, a path, but no such file or directory exists here" in text
    assert "spec.pod.volumes" in text and "Repo id must be" not in text


def test_pairs_the_reward_trainer_leaves_out_are_said_and_none_left_is_a_data_error():
    """TRL's RewardTrainer filters pairs longer than max_length out of its datasets (the others truncate)."""
    from types import SimpleNamespace

    from finetune_trainer.errors import DataError
    from finetune_trainer.training.trainer import dropped_pairs

    cfg = SimpleNamespace(spec=SimpleNamespace(data=SimpleNamespace(max_length=64)))
    said = []
    data = SimpleNamespace(train=list(range(8)), eval=list(range(4)))
    dropped_pairs(cfg, data, SimpleNamespace(train_dataset=list(range(8)), eval_dataset=list(range(4))),
                  lambda *a: said.append(a))
    assert said == []
    dropped_pairs(cfg, data, SimpleNamespace(train_dataset=list(range(6)), eval_dataset=list(range(4))),
                  lambda *a: said.append(a))
    assert said == [("PairsDropped", "2 of 8 training pair(s) are longer than data.maxLength=64 tokens (prompt and "
                     "answer) and were left out; raise data.maxLength to train on them")]
    with pytest.raises(DataError, match="no validation pair is left; raise data.maxLength"):
        dropped_pairs(cfg, data, SimpleNamespace(train_dataset=list(range(8)), eval_dataset=[]), lambda *a: None)
