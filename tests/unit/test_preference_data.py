"""Preference data (data.format preference: pairs; unpaired: KTO's labelled examples): every bad row is a DataError
naming its file and row; text and conversations in TRL's layout; the spec's objective, format and preference
settings go together."""

import json

import pytest

from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.validation import validate_job
from finetune_trainer.data.preference import for_kto, prepare_preference
from finetune_trainer.data.preference_rows import preference_row, unpaired_row
from finetune_trainer.errors import DataError
from tests.builders import make_job

KTO = {"spec.method.objective": "kto", "spec.training.perDeviceTrainBatchSize": 2}  # KTO's KL term: a batch of 2+
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
                              {"role": "user", "content": "Translate\nhello"}]  # LLaMA-Factory: one newline
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


CHAT_Q = [{"role": "user", "content": "Q?"}]


@pytest.mark.parametrize(("row", "says"), [
    ({"prompt": "Q?", "rejected": "B."}, "has no 'chosen' (chosen) value (columns: ['prompt', 'rejected'])"),
    ({"prompt": "Q?", "chosen": " ", "rejected": "B."}, "the chosen answer ('chosen') is empty"),
    ({"prompt": "Q?", "chosen": "Same.", "rejected": "Same."}, "chosen and rejected are the same answer"),
    ({"prompt": "Q?", "chosen": {"text": "A"}, "rejected": "B."}, "a dict, expected text or messages"),
    ({"prompt": [{"content": "no role"}], "chosen": "A.", "rejected": "B."}, "message 1: expected"),
    ({"prompt": CHAT_Q, "chosen": [{"role": "assistant", "content": ""}], "rejected": "B."},
     "the chosen answer is empty"),
    ({"prompt": CHAT_Q, "chosen": [{"role": "assistant", "content": [{"type": "text", "text": " "}]}],
      "rejected": "B."}, "the chosen answer is empty"),
    ({"prompt": CHAT_Q, "chosen": "A.", "rejected": [{"role": "user", "content": "B."}]},
     "rejected, message 1 has role 'user': the rejected answer is what the model says"),
    ({"instruction": "Add 2 and 2", "output": "4"},
     "has no 'chosen' (chosen) value (columns: ['instruction', 'output']); it looks like SFT data (data.format "
     "alpaca: one answer per prompt), and a preference objective needs a chosen and a rejected answer; train it "
     "with method.objective sft and data.format alpaca"),
    ({"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]},
     "it looks like SFT data (data.format messages"),
    ({"instruction": "Add 2 and 2", "chosen": "4"}, "has no 'rejected' (rejected) value (columns: ['chosen', "
                                                    "'instruction']); map it with data.columns.rejected"),
], ids=["no-chosen", "blank-chosen", "same", "dict", "no-role", "empty-chat-answer", "blank-text-part",
        "user-answer", "alpaca-sft-row", "messages-sft-row", "llamafactory-no-rejected"])
def test_a_bad_row_is_a_data_error_naming_its_file_line_and_real_columns(tmp_path, tiny_tokenizer, row, says):
    """Named by its line in the file (blank lines count, as in an editor; datasets skips them), with the columns
    the row really has (datasets gives it every column of the file, missing ones as null) and a fix that fits."""
    # Blank lines where the file's columns keep one type (with a column of mixed types, datasets falls back to a
    # reader that refuses blank lines: a file error of its own).
    blank = "\n\n" if all(isinstance(row.get(k, ""), str) for k in ("prompt", "chosen", "rejected")) else ""
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PAIRS[:2]) + blank + json.dumps(PAIRS[2]) + "\n"
                    + json.dumps(row) + "\n")
    s = spec(**{"spec.data.train": [{"path": str(path)}]})
    with pytest.raises(DataError) as err:
        prepare_preference(s.data, tiny_tokenizer, seed=42)
    assert f"{path}, line {6 if blank else 4}" in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize("conversational", [False, True], ids=["text", "chat"])
def test_a_prompt_that_leaves_no_room_for_an_answer_is_a_data_error(tiny_tokenizer, conversational):
    """Text and chat prompts alike (a chat prompt's length was once the number of keys of the tokenizer's output:
    2, so none was ever refused while TRL dropped them)."""
    words = "word " * 200
    long = ({"prompt": [{"role": "user", "content": words}], "chosen": "A.", "rejected": "B."} if conversational
            else {"prompt": words, "chosen": "A.", "rejected": "B."})
    rows = [{**p, "prompt": [{"role": "user", "content": p["prompt"]}]} if conversational else p for p in PAIRS[:2]]
    s = spec(**{"spec.data.train": [{"inline": [*rows, long]}]})
    with pytest.raises(DataError, match=r"inline rows, row 3: the prompt is \d+ tokens, data.maxLength is 64: "
                                        r"no token of the answer would be trained \(TRL would drop the row"):
        prepare_preference(s.data, tiny_tokenizer, seed=42)


@pytest.mark.parametrize("kind", ["pairs-text", "pairs-chat", "unpaired-text", "unpaired-chat"])
def test_the_prompt_length_is_trls_own_around_the_threshold(tiny_tokenizer, kind):
    """Our count against TRL's tokenization called directly (trl.data_utils, as DPOTrainer's and KTOTrainer's
    tokenize_fn): prompts of every length around data.maxLength, so a row TRL drops is exactly a row we refuse."""
    from trl.data_utils import _tokenize, common_prefix_length

    from finetune_trainer.data.preference import prompt_lengths

    chat = kind.endswith("chat")
    answers = ("chosen", "rejected") if kind.startswith("pairs") else ("completion",)
    rows = []
    for n in range(1, 40):
        prompt = " ".join(f"w{i}" for i in range(n))
        rows.append({"prompt": [{"role": "user", "content": prompt}] if chat else prompt,
                     **{k: ([{"role": "assistant", "content": f" {k} {n}"}] if chat else f" {k} {n}")
                        for k in answers}})
    expected = []
    for row in rows:
        extra = {"add_generation_prompt": True} if chat else {}
        prompt_ids = _tokenize(tiny_tokenizer, row["prompt"], **extra)["input_ids"]
        expected.append(min(common_prefix_length(prompt_ids, _tokenize(tiny_tokenizer, row["prompt"] + row[k])[
            "input_ids"]) for k in answers))
    assert prompt_lengths(rows, tiny_tokenizer) == expected
    assert min(expected) < 16 < max(expected)  # the threshold of maxLength 16 lies inside the range


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
    s = validate_job(make_job({**KTO, "spec.data": {
        "format": "unpaired", "maxLength": 64, "train": [{"inline": [*rows, bad]}]}})).spec
    with pytest.raises(DataError, match="row 4") as err:
        prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    assert says in str(err.value) and "data.columns.label" in str(err.value)


def test_a_column_whose_type_changes_is_a_data_error_naming_the_row_not_pyarrows(tmp_path, tiny_tokenizer):
    """true in one row and "maybe" in the next: for inline rows pyarrow refuses the whole table ("Could not
    convert ... to boolean"), naming neither row nor column; a file's column datasets reads as text."""
    rows = [{"prompt": "Q?", "completion": "A.", "label": True}, {"prompt": "Q?", "completion": "B.", "label": False},
            {"prompt": "Q?", "completion": "C.", "label": "maybe"}]
    s = validate_job(make_job({**KTO, "spec.data": {
        "format": "unpaired", "maxLength": 64, "train": [{"inline": rows}]}})).spec
    with pytest.raises(DataError, match=r"inline rows, row 3: 'label' is text where row 1 has true/false"):
        prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    path = tmp_path / "feedback.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = validate_job(make_job({**KTO, "spec.data": {
        "format": "unpaired", "maxLength": 64, "train": [{"path": str(path)}]}})).spec
    with pytest.raises(DataError, match=r"feedback.jsonl, line 3: 'label' \(label\) is 'maybe'"):
        prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")  # datasets reads the column as text


def test_kto_gets_each_pair_as_one_of_each_kind_in_mixed_batches(tiny_tokenizer):
    """TRL's KTOTrainer samples in order: pairs unpaired as all chosen then all rejected (or a file sorted by label)
    would train whole batches of one kind. Ours are shuffled once, with the seed: the same order every attempt."""
    s = spec(**KTO)
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
    validate_job(make_job({**KTO, "spec.data": unpaired}))
    validate_job(make_job({**KTO, "spec.data": pairs}))  # each pair: one of each kind
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
        validate_job(make_job({**KTO, "spec.data": pairs,
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


def test_kto_keeps_the_datas_own_order_when_the_job_asks_for_sequential_sampling(tiny_tokenizer):
    """training.extraArgs.train_sampling_strategy: sequential (a curriculum) is honoured: no shuffle, each pair's
    desirable example before its undesirable one, in the file's order (it was shuffled regardless)."""
    s = spec(**KTO, **{"spec.training.extraArgs": {"train_sampling_strategy": "sequential"}})
    data = prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto", sequential=True)
    assert data.train["completion"] == [p[k] for p in PAIRS for k in ("chosen", "rejected")]
    assert data.train["label"] == [True, False] * len(PAIRS)
    shuffled = prepare_preference(s.data, tiny_tokenizer, seed=42, objective="kto")
    assert shuffled.train["completion"] != data.train["completion"]


PAIRS_DATA = {"format": "preference", "train": [{"inline": PAIRS}]}


@pytest.mark.parametrize(("objective", "settings", "path", "says"), [
    ("dpo", {"spec.method.preference.labelSmoothing": 0.1}, "spec.method.preference.labelSmoothing",
     "method.objective dpo with lossType sigmoid ignores labelSmoothing (TRL reads it only for robust or exo_pair)"),
    ("dpo", {"spec.method.preference": {"lossType": "ipo", "labelSmoothing": 0.1}},
     "spec.method.preference.labelSmoothing", "with lossType ipo ignores labelSmoothing"),
    ("cpo", {"spec.method.preference": {"lossType": "hinge", "labelSmoothing": 0.1}},
     "spec.method.preference.labelSmoothing", "method.objective cpo with lossType hinge ignores labelSmoothing"),
    ("dpo", {"spec.method.preference.lossType": "exo_pair"}, "spec.method.preference.labelSmoothing",
     "lossType exo_pair divides by the assumed share of flipped labels"),
    ("orpo", {"spec.data.truncation": "drop"}, "spec.data.truncation", "tokenizes through TRL, which truncates"),
    ("reward", {"spec.data.trainOnPrompt": True}, "spec.data.trainOnPrompt", "learns the answers"),
    ("kto", {"spec.training.extraArgs": {"train_sampling_strategy": "random"}},
     "spec.training.extraArgs.train_sampling_strategy", "needs the examples in a fixed order"),
    ("kto", {"spec.training.perDeviceTrainBatchSize": 1}, "spec.training.perDeviceTrainBatchSize",
     "a batch of one has none"),
    ("dpo", {"spec.method.preference.cpoAlpha": 0.5}, "spec.method.preference.cpoAlpha", "only cpo uses it"),
    ("cpo", {"spec.method.preference.lossType": "robust"}, "spec.method.preference.lossType",
     "use one of sigmoid, hinge, ipo"),
], ids=["dpo-sigmoid-smoothing", "dpo-ipo-smoothing", "cpo-hinge-smoothing", "exo-pair-unsmoothed",
        "truncation-drop", "train-on-prompt", "kto-random-sampling", "kto-batch-of-one", "cpo-alpha-elsewhere",
        "cpo-dpo-loss"])
def test_a_preference_setting_that_cannot_take_effect_is_refused_at_validation(objective, settings, path, says):
    with pytest.raises(InvalidSpec) as err:
        validate_job(make_job({"spec.method.objective": objective, "spec.data": PAIRS_DATA,
                               "spec.training.perDeviceTrainBatchSize": 2, **settings}))
    errors = {e.path: e for e in err.value.errors}
    assert path in errors and says in str(errors[path]), [str(e) for e in err.value.errors]


def test_every_refused_preference_setting_is_named_at_once_and_the_settings_that_apply_pass():
    with pytest.raises(InvalidSpec) as err:
        validate_job(make_job({"spec.method.objective": "kto", "spec.data": {**PAIRS_DATA, "truncation": "drop",
                                                                            "trainOnPrompt": True},
                               "spec.training.extraArgs": {"train_sampling_strategy": "group_by_length"}}))
    assert {e.path for e in err.value.errors} == {
        "spec.data.truncation", "spec.data.trainOnPrompt", "spec.training.extraArgs.train_sampling_strategy",
        "spec.training.perDeviceTrainBatchSize"}
    for objective, preference in [("dpo", {"lossType": "robust", "labelSmoothing": 0.1}),
                                  ("dpo", {"lossType": "exo_pair", "labelSmoothing": 0.001}),
                                  ("simpo", {"labelSmoothing": 0.1}), ("cpo", {"labelSmoothing": 0.1}),
                                  ("cpo", {"lossType": "ipo", "cpoAlpha": 0.5})]:
        validate_job(make_job({"spec.method.objective": objective, "spec.data": PAIRS_DATA,
                               "spec.method.preference": preference}))
    validate_job(make_job({"spec.method.objective": "kto", "spec.data": PAIRS_DATA, "spec.method.preference.lossType":
                           "apo_zero_unpaired", "spec.training.extraArgs": {"train_sampling_strategy": "random"}}))


def test_cpo_is_trls_cpo_trainer_with_its_loss_and_behaviour_cloning_weight():
    from finetune_trainer.training.objectives import objective_arguments, trl_classes

    cpo = validate_job(make_job({"spec.method.objective": "cpo", "spec.data": PAIRS_DATA})).spec
    assert objective_arguments(cpo) == {"beta": 0.1, "max_length": 2048, "loss_type": "sigmoid", "cpo_alpha": 1.0,
                                        "label_smoothing": 0.0}
    config, trainer = trl_classes("cpo")
    assert (config.__name__, trainer.__name__) == ("CPOConfig", "CPOTrainer")
    args = config(output_dir="/tmp/x", use_cpu=True, bf16=False, **objective_arguments(cpo))
    assert (args.cpo_alpha, args.loss_type) == (1.0, "sigmoid")


@pytest.mark.parametrize(("count", "per_device", "processes", "drop_last", "repeated"), [
    (30, 2, 2, False, 2), (32, 2, 2, False, 0), (31, 2, 2, False, 1), (30, 2, 1, False, 0), (30, 2, 2, True, 0),
    (29, 4, 2, False, 3), (7, 1, 8, False, 1)])
def test_rows_repeated_to_fill_the_last_batch_are_counted(count, per_device, processes, drop_last, repeated):
    from finetune_trainer.training.last_batch import repeated_rows

    assert repeated_rows(count, per_device, processes, drop_last) == repeated


def test_rows_repeated_to_fill_the_last_batch_are_said_with_the_fix():
    from types import SimpleNamespace

    from finetune_trainer.training.last_batch import say_repeated_rows

    said = []
    args = SimpleNamespace(per_device_train_batch_size=2, world_size=2, dataloader_drop_last=False)
    say_repeated_rows(args, list(range(30)), "pairs", lambda *a: said.append(a))
    say_repeated_rows(args, list(range(32)), "pairs", lambda *a: said.append(a))
    assert said == [("RowsRepeated", "30 training pairs over 2 processes x 2 per process: the last batch of each "
                     "epoch is filled up with 2 pairs repeated from the start of the epoch (accelerate keeps the "
                     "processes' batches even), so they are trained twice in it; make the count a multiple of 4 "
                     "(data.maxTrainSamples), or set training.extraArgs.dataloader_drop_last: true to leave the "
                     "last 2 out instead")]
