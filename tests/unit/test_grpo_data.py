"""GRPO's prompts: TRL's standard and conversational prompt layouts and the alpaca, sharegpt and messages rows read
as prompts, every other column kept for the rewards; every bad row a DataError naming its file and row."""

import re

import pytest

from finetune_operator.api.validation import validate_job
from finetune_trainer.data.prompts import REFERENCE_COLUMN, ROW_COLUMN, checked_prompt, prepare_prompts
from finetune_trainer.errors import ConfigError, DataError
from tests.builders import make_job

REWARDS = [{"type": "exactMatch", "column": "answer"}]


def spec(data_format="prompt", rows=None, rewards=None, sources=None, **overrides):
    rows = rows or [{"prompt": f"Question {i}?", "answer": str(i)} for i in range(10)]
    return validate_job(make_job({
        "spec.method": {"objective": "grpo", "grpo": {"rewards": rewards or REWARDS, "maxCompletionLength": 16,
                                                      "numGenerations": 2}},
        "spec.data": {"format": data_format, "maxLength": 64,
                      "train": [{"inline": r} for r in sources] if sources else [{"inline": rows}]},
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 0}, "spec.training.perDeviceTrainBatchSize": 2,
        **overrides})).spec


def check(s, row, tokenizer, where="train.jsonl, row 3"):
    return checked_prompt(row, s.data, s.method.grpo, tokenizer, where)


def test_text_prompts_keep_their_columns_and_a_held_out_split(tiny_tokenizer):
    s = spec(**{"spec.data.validationSplitPercentage": 20})
    data = prepare_prompts(s.data, s.method.grpo, tiny_tokenizer, seed=42)
    assert len(data.train) == 8 and len(data.eval) == 2
    assert set(data.train.column_names) == {"prompt", "answer", ROW_COLUMN}
    assert data.stats == {"train": {"rows": 10, "prompts": 8}, "validation": {"prompts": 2}}
    assert data.train[0][ROW_COLUMN].startswith("inline rows, row ")


def test_conversational_prompts_stay_conversations_and_text_ones_join_them(tiny_tokenizer):
    """Two sources, one of conversations and one of text (within one source the loader already refuses a column
    whose type changes): one column type in the end."""
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
             "answer": "4"},
            {"prompt": "3 + 3?", "answer": "6"}]
    s = spec(sources=[[rows[0]], [rows[1]]])
    data = prepare_prompts(s.data, s.method.grpo, tiny_tokenizer, seed=1)
    assert data.train[0]["prompt"] == rows[0]["prompt"]
    assert data.train[1]["prompt"] == [{"role": "user", "content": "3 + 3?"}]  # one type per column


def test_alpaca_rows_become_a_conversation_or_the_alpaca_prompt_without_a_template(tiny_tokenizer):
    s = spec("alpaca", rows=[{"instruction": "Add", "input": "2 and 2", "output": "4", "answer": "4"}])
    row = check(s, s.data.train[0].inline[0], tiny_tokenizer)
    assert row["prompt"] == [{"role": "user", "content": "Add\n\n2 and 2"}]
    assert row["output"] == "4"  # kept: a reward may read it (column: output)
    plain = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    plain.chat_template = None
    assert check(s, s.data.train[0].inline[0], plain)["prompt"].startswith("### Instruction:\nAdd")


@pytest.mark.parametrize("data_format", ["sharegpt", "messages"])
def test_a_conversation_is_the_prompt_up_to_its_last_user_turn_and_its_reply_the_reference(data_format,
                                                                                           tiny_tokenizer):
    turns = [("system", "Maths."), ("user", "1 + 1?"), ("assistant", "2"), ("user", "2 + 2?"), ("assistant", "4")]
    if data_format == "sharegpt":
        names = {"user": "human", "assistant": "gpt", "system": "system"}
        row = {"conversations": [{"from": names[r], "value": t} for r, t in turns], "answer": "4"}
    else:
        row = {"messages": [{"role": r, "content": t} for r, t in turns], "answer": "4"}
    out = check(spec(data_format), row, tiny_tokenizer)
    assert [m["content"] for m in out["prompt"]] == ["Maths.", "1 + 1?", "2", "2 + 2?"]
    assert out[REFERENCE_COLUMN] == "4" and "conversations" not in out and "messages" not in out


# (case id, format, row, the error's fragment)
BAD_ROWS = [
    ("no-prompt", "prompt", {"question": "Q?", "answer": "1"}, "has no 'prompt' (prompt) value"),
    ("empty-prompt", "prompt", {"prompt": "  ", "answer": "1"}, "has no 'prompt' (prompt) value"),
    ("prompt-a-mapping", "prompt", {"prompt": {"q": 1}, "answer": "1"}, "'prompt' is a dict"),
    ("message-without-role", "prompt", {"prompt": [{"content": "hi"}], "answer": "1"}, "message 1: expected"),
    ("image-content", "prompt", {"prompt": [{"role": "user", "content": [{"type": "image"}]}], "answer": "1"},
     "type 'image' is not supported"),
    ("reward-column-missing", "prompt", {"prompt": "Q?"}, "has no 'answer' value, which method.grpo.rewards[0] "
     "(exact_match) reads"),
    ("reward-column-null", "prompt", {"prompt": "Q?", "answer": None}, "has no 'answer' value"),
    ("shadows-trl-argument", "prompt", {"prompt": "Q?", "answer": "1", "completions": "x"},
     "column 'completions' has the name of an argument TRL gives every reward function"),
    ("no-user-turn", "messages", {"messages": [{"role": "system", "content": "s"}], "answer": "1"},
     "has no user turn"),
    ("alpaca-without-instruction", "alpaca", {"input": "x", "answer": "1"}, "row has no 'instruction' value"),
    ("prompt-too-long", "prompt", {"prompt": "word " * 60, "answer": "1"}, "with method.grpo.maxCompletionLength 16"),
]


@pytest.mark.parametrize(("data_format", "row", "message"), [b[1:] for b in BAD_ROWS], ids=[b[0] for b in BAD_ROWS])
def test_a_bad_row_names_its_file_and_row(data_format, row, message, tiny_tokenizer):
    with pytest.raises(DataError) as info:
        check(spec(data_format), row, tiny_tokenizer)
    assert str(info.value).startswith("train.jsonl, row 3"), str(info.value)
    assert message in str(info.value), str(info.value)


def test_a_long_prompt_error_says_how_long_maxlength_must_be(tiny_tokenizer):
    s = spec()
    with pytest.raises(DataError, match=r"raise data.maxLength to at least (\d+)") as info:
        check(s, {"prompt": "word " * 60, "answer": "1"}, tiny_tokenizer)
    needed = int(re.search(r"at least (\d+)", str(info.value)).group(1))
    assert needed > 64
    # Exactly at the limit passes: prompt + maxCompletionLength == maxLength.
    fits = spec(**{"spec.data.maxLength": needed})
    assert check(fits, {"prompt": "word " * 60, "answer": "1"}, tiny_tokenizer)["answer"] == "1"
    short = spec(**{"spec.data.maxLength": needed - 1})
    with pytest.raises(DataError):
        check(short, {"prompt": "word " * 60, "answer": "1"}, tiny_tokenizer)


def test_a_conversational_prompt_length_counts_the_chat_template(tiny_tokenizer):
    """transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True): its len() is 2 (keys), not
    the tokens; the check must count the ids."""
    s = spec()
    with pytest.raises(DataError, match="the prompt is"):
        check(s, {"prompt": [{"role": "user", "content": "word " * 60}], "answer": "1"}, tiny_tokenizer)


def _between_text_and_chat(tokenizer, room: int) -> list[str]:
    """Prompts that fit `room` tokens as text and not as the one user message a conversation makes of them."""
    from finetune_trainer.data.prompts import prompt_tokens

    texts = [" ".join(f"w{i}" for i in range(n)) for n in range(1, 4 * room)]
    return [t for t in texts if prompt_tokens(t, tokenizer) <= room
            < prompt_tokens([{"role": "user", "content": t}], tokenizer)]


@pytest.mark.parametrize("conversation_in", ["train", "validation"])
def test_a_text_prompt_beside_conversations_is_checked_as_the_message_it_becomes(conversation_in, tiny_tokenizer):
    """Mixed sources: the text prompts become user messages (one column type, one template for training and held
    out prompts alike), so their length is checked with the chat template around them, at every length where the
    two forms fall on either side of the limit."""
    room = 64 - 16
    near = _between_text_and_chat(tiny_tokenizer, room)
    assert near, "the chat template adds no tokens: the case tests nothing"
    chat = [{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}]
    for text in near:
        rows = [{"prompt": text, "answer": "1"}]
        data = ({"spec.data.validation": [{"inline": chat}]} if conversation_in == "validation" else {})
        s = spec(sources=[rows, chat] if conversation_in == "train" else [rows], **data)
        with pytest.raises(DataError, match=r"inline rows, row 1: the prompt is \d+ tokens") as info:
            prepare_prompts(s.data, s.method.grpo, tiny_tokenizer, seed=1)
        needed = int(re.search(r"at least (\d+)", str(info.value)).group(1))
        fits = spec(sources=[rows, chat] if conversation_in == "train" else [rows],
                    **{**data, "spec.data.maxLength": needed})
        prepared = prepare_prompts(fits.data, fits.method.grpo, tiny_tokenizer, seed=1)
        assert prepared.train[0]["prompt"] == [{"role": "user", "content": text}]
    # Text alone stays text, checked as text: the same prompts pass.
    alone = spec(sources=[[{"prompt": t, "answer": "1"} for t in near]])
    assert prepare_prompts(alone.data, alone.method.grpo, tiny_tokenizer, seed=1).train[0]["prompt"] == near[0]


def test_a_per_row_regex_that_does_not_compile_names_the_row(tiny_tokenizer):
    s = spec(rewards=[{"type": "regex", "column": "pattern"}])
    assert check(s, {"prompt": "Q?", "pattern": r"\d+"}, tiny_tokenizer)["pattern"] == r"\d+"
    with pytest.raises(DataError, match=r"row 3: 'pattern' is not a Python regular expression"):
        check(s, {"prompt": "Q?", "pattern": "(unclosed"}, tiny_tokenizer)


def test_a_conversation_without_a_chat_template_is_a_config_error(tiny_tokenizer):
    plain = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    plain.chat_template = None
    with pytest.raises(ConfigError, match="no chat template"):
        check(spec(), {"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}, plain)


def test_columns_of_different_types_across_rows_are_a_data_error(tiny_tokenizer):
    s = spec(sources=[[{"prompt": "a", "answer": "1", "extra": 1}], [{"prompt": "b", "answer": "2", "extra": [1, 2]}]])
    with pytest.raises(DataError, match="cannot form one table"):
        prepare_prompts(s.data, s.method.grpo, tiny_tokenizer, seed=1)


def test_the_preflight_checks_prompts_and_imports_reward_functions(tiny_model_dir, tmp_path, monkeypatch):
    """Before any GPU is held: a row the trainer would refuse is exit 65 with its row; a reward function that is not
    there is exit 78 with its path."""
    import json

    from finetune_operator.api import exit_codes
    from finetune_operator.cli.local_run import prepare
    from finetune_trainer import preflight

    def run(rows, rewards, *more):
        doc = make_job({"spec.model": {"name": str(tiny_model_dir)},
                        "spec.method": {"objective": "grpo", "grpo": {"rewards": rewards, "numGenerations": 2,
                                                                      "maxCompletionLength": 8}},
                        "spec.data": {"format": "prompt", "maxLength": 64,
                                      "train": [{"inline": r} for r in (rows, *more)]},
                        "spec.distributed": {"numNodes": 1, "gpusPerNode": 0},
                        "spec.training": {"precision": "fp32", "perDeviceTrainBatchSize": 2}})
        config, _ = prepare(validate_job(doc), tmp_path / "run")
        monkeypatch.setenv("FINETUNE_TERMINATION_LOG", str(tmp_path / "log"))
        code = preflight.main(["--config", str(config)])
        return code, json.loads((tmp_path / "log").read_text())

    rows = [{"prompt": f"Q{i}?", "answer": str(i)} for i in range(5)]
    code, summary = run(rows, REWARDS)
    assert code == 0 and summary["preflight"]["sources"][0]["kept"] == 5, summary
    code, summary = run([*rows, {"prompt": "Q?"}], REWARDS)
    assert code == exit_codes.DATA_ERROR and "row 6 has no 'answer' value" in summary["message"], summary
    code, summary = run(rows, [{"type": "function", "function": "tests.support.grpo_rewards:absent"}])
    assert code == exit_codes.CONFIG_ERROR and "rewards[0].function" in summary["message"], summary
    # A text prompt that fits as text, and not as the user message a conversational source beside it makes of it.
    from transformers import AutoTokenizer

    text = _between_text_and_chat(AutoTokenizer.from_pretrained(tiny_model_dir), 64 - 8)[0]
    chat = [{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}]
    assert run([{"prompt": text, "answer": "1"}], REWARDS)[0] == 0
    code, summary = run([{"prompt": text, "answer": "1"}], REWARDS, chat)
    assert code == exit_codes.DATA_ERROR and "row 1: the prompt is" in summary["message"], summary


def test_the_data_formats_pages_prompt_row_is_read_as_written(tiny_tokenizer):
    """docs/tasks/data-formats.md's sample row of format prompt: the prompt as written, its answer kept for the
    rewards."""
    from tests.unit.test_data_formats import _page_rows

    row = _page_rows()["prompt"]
    out = check(spec(), row, tiny_tokenizer, "data-formats.md")
    assert out["prompt"] == row["prompt"] and out["answer"] == row["answer"]
