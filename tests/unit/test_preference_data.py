"""Preference data (data.format preference: pairs; unpaired: KTO's labelled examples): every bad row is a DataError
naming its file and row; text and conversations in TRL's layout; the spec's objective, format and preference
settings go together."""

import json

import pytest

from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.validation import validate_job
from finetune_trainer.data.preference import for_kto, preference_row, prepare_preference, unpaired_row
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


def test_llamafactorys_alpaca_and_sharegpt_pair_layouts_become_trls():
    """LLaMA-Factory's preference datasets (dataset_info.json `ranking: true`) as they ship: the prompt becomes the
    conversation our SFT builds from the same layout, the answers assistant turns."""
    columns = validate_job(make_job()).spec.data.columns
    alpaca = {"instruction": "Translate", "input": "hello", "chosen": "Bonjour.", "rejected": "Goodbye.",
              "system": "Be brief.", "history": [["Hi", "Hello!"]]}
    pair = preference_row(alpaca, columns, "f, row 1")
    assert pair["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello!"},
                              {"role": "user", "content": "Translate\n\nhello"}]
    assert pair["chosen"] == [{"role": "assistant", "content": "Bonjour."}]
    plain = preference_row({"instruction": "Add 2 and 2", "chosen": "4", "rejected": "5"}, columns, "f, row 2")
    assert plain["prompt"] == [{"role": "user", "content": "Add 2 and 2"}]
    sharegpt = {"conversations": [{"from": "human", "value": "2 + 2?"}], "system": "Maths.",
                "chosen": {"from": "gpt", "value": "4"}, "rejected": {"from": "gpt", "value": "5"}}
    pair = preference_row(sharegpt, columns, "f, row 3")
    assert pair == {"prompt": [{"role": "system", "content": "Maths."}, {"role": "user", "content": "2 + 2?"}],
                    "chosen": [{"role": "assistant", "content": "4"}],
                    "rejected": [{"role": "assistant", "content": "5"}]}
    mapped = validate_job(make_job({"spec.data.columns": {"conversations": "turns", "chosen": "good",
                                                          "rejected": "bad"}})).spec.data.columns
    pair = preference_row({"turns": [{"from": "user", "value": "Q"}], "good": {"from": "gpt", "value": "A"},
                           "bad": {"from": "gpt", "value": "B"}}, mapped, "f, row 4")
    assert pair["rejected"] == [{"role": "assistant", "content": "B"}]
    with pytest.raises(DataError, match=r"f, row 5: turn 1 has an unknown 'from': 'robot'"):
        preference_row({"conversations": [{"from": "robot", "value": "Q"}], "chosen": {"from": "gpt", "value": "A"},
                        "rejected": {"from": "gpt", "value": "B"}}, columns, "f, row 5")
    with pytest.raises(DataError, match=r"f, row 6: 'chosen' is a turn without a 'value'"):
        preference_row({"conversations": [{"from": "human", "value": "Q"}], "chosen": {"from": "gpt"},
                        "rejected": {"from": "gpt", "value": "B"}}, columns, "f, row 6")
    with pytest.raises(DataError, match="f, row 7: 'history' is not a list of"):
        preference_row({**alpaca, "history": "Hi"}, columns, "f, row 7")


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


@pytest.mark.parametrize(("label", "expected"), [(True, True), (False, False), (1, True), (0, False), ("true", True),
                                                 ("False", False), (" yes ", True), ("no", False), ("1", True)])
def test_an_unpaired_label_is_read_however_the_file_spells_it(label, expected):
    columns = validate_job(make_job()).spec.data.columns
    row = unpaired_row({"prompt": "Q?", "completion": "A.", "label": label}, columns, "f, row 1")
    assert row == {"prompt": "Q?", "completion": "A.", "label": expected}


@pytest.mark.parametrize(("others", "label", "says"), [(True, None, "is None"), ("true", "maybe", "is 'maybe'"),
                                                      (1, 2, "is 2")])
def test_a_label_that_is_not_a_yes_or_a_no_is_a_data_error_with_its_row(tiny_tokenizer, others, label, says):
    rows = [{"prompt": f"Q{i}?", "completion": "A.", "label": others} for i in range(3)]
    bad = {"prompt": "Q?", "completion": "A.", **({"label": label} if label is not None else {})}
    s = validate_job(make_job({"spec.method.objective": "kto", "spec.data": {
        "format": "unpaired", "maxLength": 64, "train": [{"inline": [*rows, bad]}]}})).spec
    with pytest.raises(DataError, match="row 4") as err:
        prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    assert says in str(err.value) and "data.columns.label" in str(err.value)


def test_a_column_whose_type_changes_is_a_data_error_naming_the_row_not_pyarrows(tmp_path, tiny_tokenizer):
    """true in one row and "maybe" in the next: for inline rows pyarrow refuses the whole table ("Could not
    convert ... to boolean"), naming neither row nor column; a file's column datasets reads as text."""
    rows = [{"prompt": "Q?", "completion": "A.", "label": True}, {"prompt": "Q?", "completion": "B.", "label": False},
            {"prompt": "Q?", "completion": "C.", "label": "maybe"}]
    s = validate_job(make_job({"spec.method.objective": "kto", "spec.data": {
        "format": "unpaired", "maxLength": 64, "train": [{"inline": rows}]}})).spec
    with pytest.raises(DataError, match=r"inline rows, row 3: 'label' is text where row 1 has true/false"):
        prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    path = tmp_path / "feedback.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = validate_job(make_job({"spec.method.objective": "kto", "spec.data": {
        "format": "unpaired", "maxLength": 64, "train": [{"path": str(path)}]}})).spec
    with pytest.raises(DataError, match=r"feedback.jsonl, row 3: 'label' \(label\) is 'maybe'"):
        prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")  # datasets reads the column as text


def test_kto_gets_each_pair_as_one_of_each_kind_in_mixed_batches(tiny_tokenizer):
    """TRL's KTOTrainer samples in order: pairs unpaired as all chosen then all rejected (or a file sorted by label)
    would train whole batches of one kind. Ours are shuffled once, with the seed: the same order every attempt."""
    s = spec(**{"spec.method.objective": "kto"})
    data = prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    assert set(data.train.column_names) == {"prompt", "completion", "label"} and len(data.train) == 20
    assert sum(data.train["label"]) == 10 and data.stats["train"] == {"rows": 10, "pairs": 10, "examples": 20}
    batches = [data.train["label"][i:i + 4] for i in range(0, 20, 4)]
    assert sum(1 for b in batches if 0 < sum(b) < 4) >= 3  # most batches of 4 hold both kinds
    again = prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    assert data.train["completion"] == again.train["completion"]
    pairs = prepare_preference(s.data, tiny_tokenizer, seed=42)  # dpo: the pairs as they were
    assert pairs.train["prompt"] == [p["prompt"] for p in PAIRS]
    unpaired = for_kto(data.train, seed=1)  # already unpaired: shuffled only
    assert sorted(unpaired["completion"]) == sorted(data.train["completion"])


def test_each_objective_takes_its_own_data_and_settings_and_every_error_is_named_at_once():
    unpaired = {"format": "unpaired", "train": [{"inline": [{"prompt": "Q?", "completion": "A.", "label": True}]}]}
    pairs = {"format": "preference", "train": [{"inline": PAIRS}]}
    validate_job(make_job({"spec.method.objective": "kto", "spec.data": unpaired}))
    validate_job(make_job({"spec.method.objective": "kto", "spec.data": pairs}))  # each pair: one of each kind
    for objective in ("orpo", "simpo"):
        validate_job(make_job({"spec.method.objective": objective, "spec.data": pairs}))
    with pytest.raises(InvalidSpec, match="only kto trains on unpaired examples"):
        validate_job(make_job({"spec.method.objective": "dpo", "spec.data": unpaired}))
    with pytest.raises(InvalidSpec, match="set method.objective: kto"):
        validate_job(make_job({"spec.data": unpaired}))
    with pytest.raises(InvalidSpec) as err:
        validate_job(make_job({"spec.method.objective": "orpo", "spec.data": pairs, "spec.method.preference": {
            "lossType": "sigmoid", "precomputeRefLogProbs": True, "desirableWeight": 2.0, "simpoGamma": 1.0,
            "labelSmoothing": 0.1}}))
    errors = {e.path: e for e in err.value.errors}
    assert set(errors) == {f"spec.method.preference.{f}" for f in ("lossType", "precomputeRefLogProbs",
                                                                   "desirableWeight", "simpoGamma",
                                                                   "labelSmoothing")}
    assert "it has no reference model" in str(errors["spec.method.preference.precomputeRefLogProbs"])
    with pytest.raises(InvalidSpec, match="use one of kto, apo_zero_unpaired"):
        validate_job(make_job({"spec.method.objective": "kto", "spec.data": pairs,
                               "spec.method.preference.lossType": "ipo"}))


def test_a_reward_model_trains_on_pairs_and_refuses_what_it_would_ignore():
    """objective reward: pairs only; beta (and every other objective's setting) and evaluation.prompts (a reward
    model generates nothing) are errors with their paths, all at once; centerRewardsCoefficient is reward's own."""
    pairs = {"format": "preference", "train": [{"inline": PAIRS}]}
    unpaired = {"format": "unpaired", "train": [{"inline": [{"prompt": "Q?", "completion": "A.", "label": True}]}]}
    validate_job(make_job({"spec.method.objective": "reward", "spec.data": pairs,
                           "spec.method.preference.centerRewardsCoefficient": 0.01}))
    with pytest.raises(InvalidSpec) as err:
        validate_job(make_job({"spec.method.objective": "reward", "spec.data": pairs,
                               "spec.method.preference": {"beta": 0.5, "lossType": "sigmoid"},
                               "spec.evaluation.prompts": ["Score me"]}))
    errors = {e.path: e for e in err.value.errors}
    assert set(errors) == {"spec.method.preference.beta", "spec.method.preference.lossType",
                           "spec.evaluation.prompts"}
    assert "generates no samples" in str(errors["spec.evaluation.prompts"])
    with pytest.raises(InvalidSpec, match="trains on pairs; only kto trains on unpaired examples"):
        validate_job(make_job({"spec.method.objective": "reward", "spec.data": unpaired}))
    with pytest.raises(InvalidSpec, match=r"centerRewardsCoefficient.*only reward uses it"):
        validate_job(make_job({"spec.method.objective": "dpo", "spec.data": pairs,
                               "spec.method.preference.centerRewardsCoefficient": 0.01}))
