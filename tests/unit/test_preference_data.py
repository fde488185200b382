"""Preference pairs (data.format preference): every bad row is a DataError naming its file and row; text and
conversations in TRL's layout; the spec's objective and format go together."""

import json

import pytest

from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.validation import validate_job
from finetune_trainer.data.preference import preference_row, prepare_preference
from finetune_trainer.errors import DataError
from tests.builders import make_job

PAIRS = [{"prompt": f"Question {i}?", "chosen": f" Right {i}.", "rejected": f" Wrong {i}."} for i in range(10)]


def spec(**overrides):
    return validate_job(make_job({"spec.method.objective": "dpo", "spec.data": {
        "format": "preference", "maxLength": 64, "train": [{"inline": PAIRS}]}, **overrides})).spec


def test_text_pairs_become_a_dataset_with_a_held_out_split(tiny_tokenizer):
    s = spec(**{"spec.data.validationSplitPercentage": 20})
    data = prepare_preference(s.data, tiny_tokenizer, seed=42)
    assert len(data.train) == 8 and len(data.eval) == 2
    assert set(data.train.column_names) == {"prompt", "chosen", "rejected"}
    assert data.stats["train"]["rows"] == 10


def test_conversations_and_mixed_rows_keep_trls_conversational_layout():
    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
           "chosen": "Hello.", "rejected": [{"role": "assistant", "content": [{"type": "text", "text": "Go away."}]}]}
    pair = preference_row(row, validate_job(make_job()).spec.data.columns, "inline, row 1")
    assert pair["chosen"] == [{"role": "assistant", "content": "Hello."}]
    assert pair["rejected"] == [{"role": "assistant", "content": "Go away."}]
    assert pair["prompt"][1] == {"role": "user", "content": "Hi?"}


def test_columns_are_mapped():
    columns = validate_job(make_job({"spec.data.columns": {"prompt": "q", "chosen": "good", "rejected": "bad"}}))
    pair = preference_row({"q": "Q?", "good": "A.", "bad": "B."}, columns.spec.data.columns, "f, row 1")
    assert pair == {"prompt": "Q?", "chosen": "A.", "rejected": "B."}


@pytest.mark.parametrize(("row", "says"), [
    ({"prompt": "Q?", "rejected": "B."}, "has no 'chosen' (chosen) value"),
    ({"prompt": "Q?", "chosen": " ", "rejected": "B."}, "has no 'chosen' (chosen) value"),
    ({"prompt": "Q?", "chosen": "Same.", "rejected": "Same."}, "chosen and rejected are the same answer"),
    ({"prompt": "Q?", "chosen": {"text": "A"}, "rejected": "B."}, "a dict, expected text or messages"),
    ({"prompt": [{"content": "no role"}], "chosen": "A.", "rejected": "B."}, "message 1: expected"),
])
def test_a_bad_row_is_a_data_error_with_its_file_and_row(tmp_path, tiny_tokenizer, row, says):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*PAIRS[:3], row]))
    s = spec(**{"spec.data.train": [{"path": str(path)}]})
    with pytest.raises(DataError, match="row 4") as err:
        prepare_preference(s.data, tiny_tokenizer, seed=42)
    assert says in str(err.value) and "pairs.jsonl" in str(err.value)


def test_a_prompt_that_leaves_no_room_for_an_answer_is_a_data_error(tiny_tokenizer):
    long = {"prompt": "word " * 200, "chosen": "A.", "rejected": "B."}
    s = spec(**{"spec.data.train": [{"inline": [*PAIRS[:2], long]}]})
    with pytest.raises(DataError, match=r"inline.*row 3: the prompt is \d+ tokens, data.maxLength is 64"):
        prepare_preference(s.data, tiny_tokenizer, seed=42)


def test_objective_and_format_go_together_and_every_error_is_named_at_once():
    with pytest.raises(InvalidSpec) as err:
        validate_job(make_job({"spec.method.objective": "dpo", "spec.data.format": "alpaca",
                               "spec.data.packing": True}))
    paths = [e.path for e in err.value.errors]
    assert "spec.data.format" in paths and "spec.data.packing" in paths
    with pytest.raises(InvalidSpec, match="set method.objective: dpo"):
        validate_job(make_job({"spec.data": {"format": "preference", "train": [{"inline": PAIRS}]}}))


def test_resuming_with_another_objective_is_refused(tmp_path):
    """The checkpoint's provenance records the method, objective included: an sft checkpoint is not resumed by a
    dpo job (the trainer's _compatible makes that exit 78), nor the other way round."""
    from finetune_trainer.outputs import checkpoints

    sft, dpo = validate_job(make_job()).spec, spec()
    directory = tmp_path / "checkpoint-10"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"x")
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    checkpoints.mark_complete(directory, checkpoints.provenance(sft))
    assert checkpoints.incompatibility(directory, sft, keys=checkpoints.MODEL_KEYS) is None
    why = checkpoints.incompatibility(directory, dpo, keys=checkpoints.MODEL_KEYS)
    assert why is not None and "method" in why
