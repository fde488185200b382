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


def test_preference_pairs_are_checked_as_the_trainer_checks_them(tiny_model_dir, tmp_path, monkeypatch):
    pairs = [{"prompt": f"Q{i}?", "chosen": f"A{i}.", "rejected": f"B{i}."} for i in range(5)]
    dpo = {"spec.method.objective": "dpo", "spec.data": {"format": "preference", "train": [{"inline": pairs}]}}
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch, **dpo)
    assert code == 0 and summary["preflight"]["sources"][0]["kept"] == 5, summary
    bad = [*pairs[:2], {"prompt": "Q?", "chosen": "Same.", "rejected": "Same."}]
    code, summary = run(tiny_model_dir, tmp_path, monkeypatch,
                        **{**dpo, "spec.data": {"format": "preference", "train": [{"inline": bad}]}})
    assert code == exit_codes.DATA_ERROR and "row 3: chosen and rejected are the same answer" in summary["message"]
