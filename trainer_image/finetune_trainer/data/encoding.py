"""One row -> token ids and labels: the chat template or a prompt/completion split, maxLength and truncation, and the
count of what happened to every row (TokenizeStats)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from finetune_operator.api.data import DataSpec
from finetune_trainer.data import formats
from finetune_trainer.data.chat import ChatEncoder, Encoded
from finetune_trainer.data.labels import IGNORE_INDEX, labels_from_spans
from finetune_trainer.errors import DataError

# What happened to each row (the `status` column of the tokenized dataset). DROPPED_CUT: cut at maxLength before
# its reply began (nothing left to learn), not a row without a reply (DROPPED_NO_TARGET).
KEPT, TRUNCATED, DROPPED_TOO_LONG, DROPPED_NO_TARGET, DROPPED_CUT = 0, 1, 2, 3, 4
# The TokenizeStats counter of each outcome, and the key of its first example in `first`.
OUTCOMES = {TRUNCATED: "truncated", DROPPED_TOO_LONG: "dropped_too_long", DROPPED_NO_TARGET: "dropped_no_target",
            DROPPED_CUT: "dropped_cut_before_reply"}
FOLDED = "system_folded"


@dataclass
class TokenizeStats:
    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_target: int = 0
    dropped_cut_before_reply: int = 0
    trainable_tokens: int = 0
    reply_tokens_cut: int = 0  # learned tokens the truncated rows lost at maxLength
    tokens: int = 0
    system_folded: int = 0  # rows whose system prompt the template refused, folded into the first user turn
    longest: int = 0  # tokens of the longest row before maxLength applied (what a maxLength would need)
    first: dict[str, str] = field(default_factory=dict)  # outcome -> where its first row is ("file, row N")

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "first": dict(self.first)}

    def example(self, outcome: str, where: str | None) -> None:
        if where is not None:
            self.first.setdefault(outcome, where)

    def count(self, status: int, ids: list[int], labels: list[int], folded: bool = False, length: int = 0,
              where: str | None = None, cut: int = 0) -> None:
        self.rows += 1
        self.longest = max(self.longest, length, len(ids))
        self.system_folded += folded
        if folded:
            self.example(FOLDED, where)
        if status in OUTCOMES:
            setattr(self, OUTCOMES[status], getattr(self, OUTCOMES[status]) + 1)
            self.example(OUTCOMES[status], where)
        if status in (KEPT, TRUNCATED):
            self.kept += 1
            self.reply_tokens_cut += cut
            self.tokens += len(ids)
            self.trainable_tokens += sum(1 for t in labels if t != IGNORE_INDEX)


def uses_chat_template(data: DataSpec, tokenizer: Any) -> bool:
    """Rows are rendered with the chat template: conversations always, Alpaca rows when the tokenizer has one."""
    return data.format in ("sharegpt", "messages") or (data.format == "alpaca" and bool(tokenizer.chat_template))


@dataclass(frozen=True)
class RowEncoder:
    """What turns a row into (ids, labels) for one data spec and tokenizer; picklable for worker processes."""

    data: DataSpec
    tokenizer: Any
    chat: ChatEncoder | None

    @classmethod
    def build(cls, data: DataSpec, tokenizer: Any) -> "RowEncoder":
        chat = ChatEncoder.for_tokenizer(tokenizer) if uses_chat_template(data, tokenizer) else None
        return cls(data, tokenizer, chat)

    def encode(self, row: dict[str, Any]) -> tuple[list[int], list[int]]:
        ids, labels, _ = self.encode_row(row)
        return ids, labels

    def encode_row(self, row: dict[str, Any]) -> Encoded:
        fmt, columns = self.data.format, self.data.columns
        if self.chat is not None:
            return self.chat.encode_many([formats.CHAT_FORMATS[fmt](row, columns)], self.data.train_on_prompt)[0]
        prompt, completion = (formats.alpaca_prompt if fmt == "alpaca" else formats.prompt_completion)(row, columns)
        return Encoded(*encode_completion(prompt, completion, self.tokenizer, self.data.train_on_prompt), False)

    def encode_batch(self, rows: list[dict[str, Any]], where: list[str]) -> list[Encoded]:
        """Rows encoded together (conversations tokenized in one call); a bad row is a DataError naming `where`."""
        if self.chat is None:
            return [_named(where[i], self.encode_row, row) for i, row in enumerate(rows)]
        fmt, columns = self.data.format, self.data.columns
        conversations = [_named(where[i], formats.CHAT_FORMATS[fmt], row, columns) for i, row in enumerate(rows)]
        try:
            return self.chat.encode_many(conversations, self.data.train_on_prompt)
        except DataError:  # a template refused one of them: say which
            for i, conversation in enumerate(conversations):
                _named(where[i], self.chat.encode, conversation)
            raise


def _named(where: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None


def encode_completion(prompt: str, completion: str, tokenizer: Any, train_on_prompt: bool = False
                      ) -> tuple[list[int], list[int]]:
    """prompt + completion tokenized in one call, as `tokenizer(text)` at inference (its BOS if it adds one), then
    the real EOS; the completion and the EOS are learned (a token straddling the boundary is learned too)."""
    text = prompt + completion
    encoded = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
        offsets.append((len(text), len(text) + 1))
    spans = [(0, len(text) + 1)] if train_on_prompt else [(len(prompt), len(text) + 1)]
    return ids, labels_from_spans(ids, offsets, spans)


def fit(ids: list[int], labels: list[int], data: DataSpec) -> tuple[list[int], list[int], int]:
    """maxLength and truncation applied: (ids, labels, status)."""
    ids, labels, status, _, _ = fit_counted(ids, labels, data)
    return ids, labels, status


def fit_counted(ids: list[int], labels: list[int], data: DataSpec) -> tuple[list[int], list[int], int, int, int]:
    """fit, the number of learned tokens it kept (counted once) and the number a cut took away."""
    learned = len(labels) - labels.count(IGNORE_INDEX)
    if not learned:
        return [], [], DROPPED_NO_TARGET, 0, 0
    status = KEPT
    if len(ids) > data.max_length:
        if data.truncation == "drop":
            return [], [], DROPPED_TOO_LONG, 0, 0
        ids, labels, status = ids[: data.max_length], labels[: data.max_length], TRUNCATED
    kept = len(labels) - labels.count(IGNORE_INDEX)
    if not kept:
        return [], [], DROPPED_CUT, 0, 0
    return ids, labels, status, kept, learned - kept


def sft_example(row: dict[str, Any], encoder: RowEncoder, stats: TokenizeStats, where: str = "row"
                ) -> dict[str, list[int]] | None:
    """One row -> token ids and labels, or None when it is dropped (too long under truncation drop, no target)."""
    try:
        ids, labels, folded = encoder.encode_row(row)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    length = len(ids)
    ids, labels, status, _, cut = fit_counted(ids, labels, encoder.data)
    stats.count(status, ids, labels, folded, length, where, cut)
    return {"input_ids": ids, "labels": labels} if status in (KEPT, TRUNCATED) else None
