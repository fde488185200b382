"""Preflight: the trainer's contract (exit code, termination message) for what would fail a first attempt."""

import json

from finetune_operator.api import exit_codes
from finetune_operator.api.validation import validate_job
from finetune_operator.cli.local_run import prepare
from finetune_trainer import preflight
from tests.builders import make_job

ROWS = [{"instruction": f"Say {i}.", "output": f"{i}."} for i in range(100)]


def run(tiny_model_dir, tmp_path, monkeypatch, **overrides):
    doc = make_job({"spec.model": {"name": str(tiny_model_dir)},
                    "spec.data": {"format": "alpaca", "train": [{"inline": ROWS}]},
                    "spec.distributed": {"numNodes": 1, "gpusPerNode": 0}, "spec.training.precision": "fp32",
                    **overrides})
    config, _ = prepare(validate_job(doc), tmp_path / "run")
    log = tmp_path / "termination-log"
    monkeypatch.setenv("FINETUNE_TERMINATION_LOG", str(log))
    code = preflight.main(["--config", str(config)])
    return code, json.loads(log.read_text())


def test_a_good_job_passes_with_what_it_checked(tiny_model_dir, tmp_path, monkeypatch):
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **{"spec.data.validation": [{"inline": ROWS[:3]}]})
    assert code == 0 and summary["reason"] == "Succeeded"
    report = summary["preflight"]
    assert report["modelType"] == "llama"
    assert [(s["source"], s["rows"], s["kept"]) for s in report["sources"]] == [
        ("data.train[0]", preflight.ROWS_PER_SOURCE, preflight.ROWS_PER_SOURCE), ("data.validation[0]", 3, 3)]


def test_wrong_columns_are_a_data_error(tiny_model_dir, tmp_path, monkeypatch):
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **{"spec.data.columns": {"instruction": "question"}})
    assert code == exit_codes.DATA_ERROR and summary["reason"] == "DataError"
    assert summary["message"].startswith("preflight: ")


def test_a_missing_data_file_is_a_data_error(tiny_model_dir, tmp_path, monkeypatch):
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch,
                        **{"spec.data.train": [{"path": str(tmp_path / "nowhere.jsonl")}]})
    assert code == exit_codes.DATA_ERROR and "no data file" in summary["message"]


def test_a_missing_model_is_a_config_error(tiny_model_dir, tmp_path, monkeypatch):
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **{"spec.model.name": str(tmp_path / "no-model")})
    assert code == exit_codes.CONFIG_ERROR and summary["reason"] == "InvalidConfig"


def test_an_unusable_resume_checkpoint_is_a_config_error(tiny_model_dir, tmp_path, monkeypatch):
    (tmp_path / "checkpoint-7").mkdir()
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch,
                        **{"spec.checkpoints.resume": str(tmp_path / "checkpoint-7")})
    assert code == exit_codes.CONFIG_ERROR and "unusable checkpoint" in summary["message"]


def test_a_job_that_cannot_fit_its_gpus_is_refused_with_the_numbers_and_what_fits(tiny_model_dir, tmp_path,
                                                                                   monkeypatch):
    """64 sequences of 2048 tokens a micro-batch on a 2 GiB GPU: exit 78 before any GPU is held, with the predicted
    need, the largest term, and the cheapest change that fits (estimated again)."""
    gpu = {"spec.distributed": {"numNodes": 1, "gpusPerNode": 1}, "spec.resources.gpuMemoryGiB": 2,
           "spec.training.perDeviceTrainBatchSize": 64, "spec.data.maxLength": 2048, "spec.data.packing": True}
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **gpu)
    assert code == exit_codes.CONFIG_ERROR and summary["reason"] == "InvalidConfig", summary
    message = summary["message"]
    assert message.startswith("preflight: memory: does not fit: needs ") and " of 2 GiB (spec.resources" in message
    assert "largest term: " in message and "what fits: " in message, message
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **{**gpu, "spec.resources.gpuMemoryGiB": 40})
    assert code == 0, summary
    memory = summary["memoryEstimate"]
    assert memory["fits"] is True and memory["capacityGiB"] == 40 and 0 < memory["neededGiB"] < 40
    assert memory["largestTerm"] in memory["terms"]


def test_an_fsdp_job_with_an_fsdp_block_that_cannot_fit_is_a_config_error_with_changes_that_validate(
        tiny_model_dir, tmp_path, monkeypatch):
    """The issue: an FSDP spec with an fsdp: block that did not fit made the preflight exit 1 (a retryable Error: the
    advice switched the strategy with the block still there, and validating it raised). Now exit 78 with the
    numbers, and every change offered is a spec the API takes."""
    fsdp = {"spec.distributed": {"numNodes": 1, "gpusPerNode": 2, "strategy": "fsdp",
                                 "fsdp": {"activationCheckpointing": False}},
            "spec.resources.gpuMemoryGiB": 1, "spec.training.perDeviceTrainBatchSize": 64,
            "spec.data.maxLength": 2048, "spec.data.packing": True}
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **fsdp)
    assert code == exit_codes.CONFIG_ERROR and summary["reason"] == "InvalidConfig", summary
    message = summary["message"]
    assert message.startswith("preflight: memory: does not fit: needs ") and "what fits: " in message, message
    remedies = message.split("what fits: ")[1].split("; or ")
    assert len(remedies) == len(set(remedies)), remedies  # the same change is not offered twice


def test_preference_pairs_are_checked_as_the_trainer_checks_them(tiny_model_dir, tmp_path, monkeypatch):
    pairs = [{"prompt": f"Q{i}?", "chosen": f"A{i}.", "rejected": f"B{i}."} for i in range(5)]
    dpo = {"spec.method.objective": "dpo", "spec.data": {"format": "preference", "train": [{"inline": pairs}]}}
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **dpo)
    assert code == 0 and summary["preflight"]["sources"][0]["kept"] == 5, summary
    bad = [*pairs[:2], {"prompt": "Q?", "chosen": "Same.", "rejected": "Same."}]
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch,
                        **{**dpo, "spec.data": {"format": "preference", "train": [{"inline": bad}]}})
    assert code == exit_codes.DATA_ERROR and "row 3: chosen and rejected are the same answer" in summary["message"]


def test_a_moe_lora_that_peft_cannot_build_is_refused_before_any_gpu_is_held(tmp_path, monkeypatch):
    """A small Mixtral (transformers 5: fused experts) with LoRA on all linear layers and the default dropout 0.05:
    peft would refuse it after the GPUs are held (ParamWrapper and dropout); the preflight refuses it first (78),
    with the field, the value and the fix, and passes it with dropout 0."""
    from finetune_trainer.tiny_model import build_tiny_model

    mixtral = build_tiny_model(tmp_path / "mixtral", architecture="mixtral", num_local_experts=4,
                               num_experts_per_tok=2)
    lora = {"spec.method.type": "lora"}
    code, summary = run(mixtral, tmp_path / "a", monkeypatch, **lora)
    assert code == exit_codes.CONFIG_ERROR and summary["reason"] == "InvalidConfig", summary
    assert "spec.method.lora.dropout: 0.05 cannot be built for mixtral" in summary["message"]
    assert "set method.lora.dropout: 0" in summary["message"]
    code, summary = run(mixtral, tmp_path / "b", monkeypatch, **lora, **{"spec.method.lora": {"dropout": 0.0}})
    assert code == 0, summary


def test_a_gpu_whose_memory_is_unknown_is_said_not_skipped(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """The issue: B300, A40 or RTX 5090 (then) skipped the check silently. The preflight passes (it cannot
    compare) but says so, with the field to set."""
    unknown = {"spec.distributed": {"numNodes": 1, "gpusPerNode": 1},
               "spec.pod.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-Future-X9"}}
    with caplog.at_level("WARNING", logger="finetune_trainer.preflight"):
        code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **unknown)
    assert code == 0 and summary["memoryEstimate"].get("capacityGiB") is None
    assert any("NVIDIA-Future-X9 is a GPU whose memory we do not know: set spec.resources.gpuMemoryGiB"
               in r.getMessage() for r in caplog.records)


def test_each_attempt_checks_again_before_its_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    """Without the preflight (off by default) the trainer itself refuses what cannot be built, and a job whose
    central estimate exceeds its GPU's whole memory (torch's figure, stood in for here: no GPU on this machine),
    before loading weights; where the estimate does not model the job (torch_compile), a warning only."""
    import pytest

    from finetune_trainer.errors import ConfigError
    from finetune_trainer.tiny_model import build_tiny_model
    from finetune_trainer.training import memory_check

    mixtral = build_tiny_model(tmp_path / "mixtral", architecture="mixtral", num_local_experts=4, num_experts_per_tok=2)
    moe = validate_job(make_job({"spec.model.name": str(mixtral), "spec.method.type": "lora",
                                 "spec.distributed.gpusPerNode": 0})).spec
    said = []
    with pytest.raises(ConfigError, match="lora.dropout: 0.05 cannot be built"):
        memory_check.check_before_loading(moe, 512, lambda *a: said.append(a))
    gpu = {"spec.model.name": str(tiny_model_dir), "spec.distributed.gpusPerNode": 1,
           "spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 64}
    monkeypatch.setattr(memory_check, "device_gib", lambda: 0.5)
    with pytest.raises(ConfigError, match="memory: does not fit: needs .* of 0.5 GiB \\(this GPU"):
        memory_check.check_before_loading(validate_job(make_job(gpu)).spec, 512, lambda *a: said.append(a))
    compiled = validate_job(make_job({**gpu, "spec.training.extraArgs": {"torch_compile": True}})).spec
    memory_check.check_before_loading(compiled, 512, lambda *a: said.append(a))
    assert said and said[-1][0] == "MemoryTight"
    monkeypatch.setattr(memory_check, "device_gib", lambda: 80.0)
    said.clear()
    memory_check.check_before_loading(validate_job(make_job(gpu)).spec, 512, lambda *a: said.append(a))
    assert not said
