"""Every row that is not trained whole is counted and said, each kind with its first row: cut at maxLength (and
how many reply tokens that cost), left out as too long (truncation: drop), cut before its reply began, or without
a reply; the cached, the streamed and the nothing-left paths count them the same way."""

import json
from types import SimpleNamespace

import pytest

from finetune_operator.api.data import DataSpec
from finetune_trainer import data as D
from finetune_trainer.data.streaming import SEEN, prepare_streaming, streamed_stats
from finetune_trainer.errors import DataError
from finetune_trainer.training import advice

SHORT = {"instruction": "Hi.", "output": "Yo."}
LONG_REPLY = {"instruction": "Hi.", "output": "word " * 40}
LONG_PROMPT = {"instruction": "word " * 40, "output": "x"}


def spec(rows_or_path, **kw) -> DataSpec:
    source = {"path": rows_or_path} if isinstance(rows_or_path, str) else {"inline": rows_or_path}
    return DataSpec.model_validate({"format": "alpaca", "train": [source], "maxLength": 24, **kw})


def said(data: DataSpec, stats: dict, streamed: bool = False) -> dict[str, str]:
    out: dict[str, str] = {}
    advice.row_outcomes(SimpleNamespace(data=data), stats, lambda reason, text: out.setdefault(reason, text),
                        streamed)
    return out


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_issues_run_says_the_rows_cut_and_the_rows_dropped(tiny_tokenizer, tmp_path):
    """20 of 64 rows cut at maxLength and 44 whose prompt filled it: the old RowsTruncated said "20 of 64 were cut"
    and nothing of the 44 left out. Now both, with counts, the reply tokens lost and the first row of each."""
    rows = [LONG_REPLY] * 10 + [LONG_PROMPT] + [LONG_REPLY] * 10 + [LONG_PROMPT] * 43
    path = write_rows(tmp_path / "train.jsonl", rows)
    data = spec(path)
    prepared = D.prepare(data, tiny_tokenizer, tmp_path / "cache", seed=1)
    stats = prepared.stats["train"]
    assert (stats["rows"], stats["kept"], stats["truncated"], stats["dropped_cut_before_reply"]) == (64, 20, 20, 44)
    assert stats["first"] == {"truncated": f"{path}, row 1", "dropped_cut_before_reply": f"{path}, row 11"}
    text = said(data, prepared.stats)
    assert text["RowsTruncated"].startswith(f"20 of 64 training row(s) were longer than data.maxLength=24 tokens "
                                            f"(the first: {path}, row 1; the longest: ")
    assert f"{stats['reply_tokens_cut']} reply token(s) past the cut are not trained" in text["RowsTruncated"]
    assert f"({stats['trainable_tokens']} reply token(s) of 20 row(s) are trained)" in text["RowsTruncated"]
    assert text["RowsDropped"].startswith(
        f"44 of 64 training row(s) were left out and are not trained: 44 cut at data.maxLength=24 before their "
        f"reply began, the prompt alone filling it (the first: {path}, row 11). 20 row(s) with "
        f"{stats['trainable_tokens']} reply token(s) are")


@pytest.mark.parametrize("truncation", ["truncate", "drop"])
def test_every_outcome_is_counted_once_with_its_first_row(tiny_tokenizer, truncation):
    rows = [SHORT, LONG_REPLY, LONG_PROMPT, {"instruction": "Q", "output": None}, SHORT]
    data = spec(rows, truncation=truncation, columns={"output": "output"})
    _, stats = D.tokenize([r for r in rows if r["output"] is not None] + [{"instruction": "Q", "output": ""}],
                          data, tiny_tokenizer)
    counts = stats.as_dict()
    if truncation == "truncate":
        assert (counts["kept"], counts["truncated"], counts["dropped_cut_before_reply"]) == (4, 1, 1)
        assert counts["first"] == {"truncated": "rows, row 2", "dropped_cut_before_reply": "rows, row 3"}
    else:  # too long under drop: left out as such, whether its reply began before maxLength or not
        assert (counts["kept"], counts["dropped_too_long"]) == (3, 2)
        assert counts["first"] == {"dropped_too_long": "rows, row 2"}
        assert "2 longer than data.maxLength=24 tokens under truncation: drop (the first: rows, row 2)" \
            in said(data, {"train": counts})["RowsDropped"]


def test_rows_cut_before_their_reply_are_not_called_rows_without_a_reply(tiny_tokenizer, tmp_path):
    """The issue: every row cut before its reply said "no reply"."""
    _, stats = D.tokenize([LONG_PROMPT], spec([LONG_PROMPT], maxLength=16), tiny_tokenizer)
    assert (stats.dropped_cut_before_reply, stats.dropped_no_target) == (1, 0)
    path = write_rows(tmp_path / "long-prompts.jsonl", [LONG_PROMPT] * 2)
    with pytest.raises(DataError) as caught:
        D.prepare(spec(path, maxLength=16), tiny_tokenizer, tmp_path / "cache", seed=1)
    assert f"from {path}: 2 row(s), 2 cut at data.maxLength=16 before their reply began" in str(caught.value)
    assert "no reply" not in str(caught.value)


def test_a_streamed_run_counts_the_rows_it_read_once_whatever_the_epochs(tiny_tokenizer):
    SEEN.clear()
    rows = [SHORT, LONG_REPLY, LONG_PROMPT, SHORT]
    data = spec(rows, streaming=True)
    prepared = prepare_streaming(data, tiny_tokenizer, seed=1)
    for _ in range(2):  # two epochs: the same rows read again
        assert len(list(prepared.train)) == 3
    counts = streamed_stats()["train"]
    assert (counts["rows"], counts["kept"], counts["truncated"], counts["dropped_cut_before_reply"]) == (4, 3, 1, 1)
    assert counts["first"] == {"truncated": "inline rows, row 2", "dropped_cut_before_reply": "inline rows, row 3"}
    text = said(data, {"train": counts}, streamed=True)
    assert text["RowsTruncated"].startswith("1 of 4 streamed training row(s) were longer than data.maxLength=24")
    assert text["RowsDropped"].startswith("1 of 4 streamed training row(s) were left out")
