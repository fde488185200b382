"""Where data and tokenizers come from, said plainly: the Hugging Face Hub's dataset layout read as it is, files of
more than one type named, a JSON Lines file of blank lines and a model folder without tokenizer files refused with
our message and its fix."""

import json
import shutil

import pytest

from finetune_operator.api.data import DataSpec
from finetune_operator.api.validation import validate_job
from finetune_trainer import data as D
from finetune_trainer.errors import ConfigError, DataError
from tests.builders import make_job

ROW = {"instruction": "Q", "output": "A"}


def spec(source: dict) -> DataSpec:
    return DataSpec.model_validate({"format": "alpaca", "train": [source]})


def hub_layout(root):
    """What `huggingface-cli download --repo-type dataset` leaves: a dataset card beside data/*.jsonl."""
    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text("---\nlicense: mit\n---\n# A dataset\n")
    for i in range(2):
        (root / "data" / f"train-0000{i}-of-00002.jsonl").write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n")
    return root


@pytest.mark.parametrize("file_type", [None, "json", "jsonl"])
def test_the_hub_dataset_layout_is_read_without_its_card(tmp_path, file_type):
    """The issue: README.md + data/*.jsonl was refused ("cannot tell the file type"), and the suggested fileType
    then failed reading README.md as JSON."""
    root = hub_layout(tmp_path / "repo")
    parts = D.load_source(spec({"path": str(root), **({"fileType": file_type} if file_type else {})}).train[0],
                          spec({"path": str(root)}))
    assert [(part.name, len(part.rows)) for part in parts] == [
        (str(root / "data" / f"train-0000{i}-of-00002.jsonl"), 2) for i in range(2)]


def test_files_of_more_than_one_type_are_named_with_the_fix(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(ROW) + "\n")
    (tmp_path / "b.csv").write_text("instruction,output\nQ,A\n")
    with pytest.raises(DataError) as caught:
        D.load_source(spec({"path": str(tmp_path)}).train[0], spec({"path": str(tmp_path)}))
    assert f"{tmp_path} holds files of more than one type (csv: b.csv; json: a.jsonl); set fileType" \
        in str(caught.value)
    parts = D.load_source(spec({"path": str(tmp_path), "fileType": "csv"}).train[0], spec({"path": str(tmp_path)}))
    assert [part.name for part in parts] == [str(tmp_path / "b.csv")]  # fileType picks the files of its type


def test_a_jsonl_file_of_blank_lines_is_our_data_error(tmp_path):
    """Not datasets' "Instruction 'train' corresponds to no data!"."""
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n   \n\n")
    with pytest.raises(DataError, match=rf"{path}: no rows \(the file holds only blank lines\)"):
        D.load_source(spec({"path": str(path)}).train[0], spec({"path": str(path)}))


def test_a_model_folder_without_tokenizer_files_is_said_at_once(tiny_model_dir, tmp_path):
    """The issue: "install sentencepiece or tiktoken", 55 s later. The folder is named with what is missing."""
    from finetune_trainer.training.model import load_tokenizer

    bare = tmp_path / "model"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, bare / name)
    shutil.copy(tiny_model_dir / "tokenizer_config.json", bare)  # a config alone is no vocabulary
    job = validate_job(make_job({"spec.model.name": str(bare), "spec.distributed.gpusPerNode": 0}))
    with pytest.raises(ConfigError, match=rf"spec.model.name: {bare} has no tokenizer files \(none of tokenizer.json"):
        load_tokenizer(job.spec)
    with_tokenizer = validate_job(make_job({"spec.model": {"name": str(bare), "tokenizer": str(tiny_model_dir)},
                                            "spec.distributed.gpusPerNode": 0}))
    assert load_tokenizer(with_tokenizer.spec).eos_token == "</s>"  # the fix the message names
