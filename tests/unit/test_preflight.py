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
