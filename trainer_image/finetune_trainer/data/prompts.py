"""Prompts for GRPO, in the layouts TRL's GRPOTrainer reads (it applies the chat template to conversations and
generates the completions itself): data.format prompt (a `prompt` column, text or a list of role/content messages),
or alpaca, sharegpt and messages rows read as prompts (the conversation up to its last user turn). Every other column
of a row is kept: TRL passes them to the reward functions by name (`answer`, `solution`, ...).

Every row is checked before training, with its file and row (exit 65): no prompt, a prompt that is neither text nor
messages, a prompt that leaves no room for maxCompletionLength tokens within data.maxLength, a column a reward reads
missing. Each row carries ROW_COLUMN (its file and row), which finetune_trainer.training.rewards uses to name the
row a reward function failed on, and drops before calling it."""

import re
from typing import Any

from finetune_operator.api.data import DataSpec
from finetune_operator.api.grpo import DEFAULT_COLUMNS, GrpoSpec
from finetune_trainer.data.formats import (
    _col,
    alpaca_messages,
    alpaca_prompt,
    content_text,
    messages_messages,
    sharegpt_messages,
)
from finetune_trainer.data.loading import Part, load_rows
from finetune_trainer.data.prepared import PreparedData
from finetune_trainer.errors import ConfigError, DataError

ROW_COLUMN = "_finetune_row"
# Names TRL gives its own arguments of a reward function: a column of the same name would be passed twice.
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                    "environments")
REFERENCE_COLUMN = "reference"  # sharegpt and messages: the reply after the last user turn, for rewards to compare


def reward_columns(grpo: GrpoSpec) -> list[tuple[int, str, str]]:
    """(index, reward name, column) of each reward that reads a column of the row."""
    out = []
    for i, reward in enumerate(grpo.rewards):
        column = reward.column or DEFAULT_COLUMNS.get(reward.type)
        if column is not None:
            out.append((i, reward.default_name, column))
    return out


def prompt_messages(value: list[Any], where: str) -> list[dict[str, str]]:
    """A prompt given as messages: each a role and text content (OpenAI-style text parts joined)."""
    if not value:
        raise DataError(f"{where} is an empty list: expected text or role/content messages")
    out = []
    for j, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise DataError(f"{where}, message {j + 1}: expected {{\"role\": ..., \"content\": ...}}")
        out.append({"role": message["role"], "content": content_text(message.get("content"),
                                                                     f"{where}, message {j + 1}")})
    return out


def prompt_tokens(prompt: Any, tokenizer: Any) -> int:
    """Tokens of a prompt as TRL feeds it to generation: a conversation rendered with its generation prompt."""
    if isinstance(prompt, list):  # transformers 5 returns a BatchEncoding here, not the ids
        return len(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)["input_ids"])
    return len(tokenizer(prompt)["input_ids"])


def conversation_prompt(messages: list[dict[str, str]], where: str) -> tuple[list[dict[str, str]], str | None]:
    """The conversation up to and including its last user turn, and the reply after it (None when there is none):
    what the model is to answer, and what a reward may compare with."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise DataError(f"{where} has no user turn: nothing for the model to answer")
    replies = [m["content"] for m in messages[last_user + 1:] if m["role"] == "assistant"]
    return messages[:last_user + 1], (replies[0] if replies else None)


def prompt_row(row: dict[str, Any], data: DataSpec, chat: bool, where: str) -> dict[str, Any]:
    """One row -> {"prompt": text or messages, the row's other columns}. `chat`: the tokenizer has a chat template
    (alpaca rows become a conversation; without one, the classic Alpaca prompt text, as our SFT does)."""
    columns, fmt = data.columns, data.format
    extra = {k: v for k, v in row.items() if not k.startswith("_")}
    try:
        if fmt == "prompt":
            column = _col(columns, "prompt")
            value = extra.pop(column, None)
            if value is None or (isinstance(value, str) and not value.strip()):
                raise DataError(f"has no '{column}' (prompt) value (columns: {sorted(row)}); map it with "
                                "data.columns.prompt")
            if isinstance(value, list):
                prompt: Any = prompt_messages(value, f"'{column}'")
            elif isinstance(value, str | int | float):
                prompt = str(value)
            else:
                raise DataError(f"'{column}' is a {type(value).__name__}: expected text or a list of role/content "
                                "messages")
        elif fmt == "alpaca":
            if chat:
                prompt = alpaca_messages({**row, _col(columns, "output"): ""}, columns)[:-1]
            else:
                prompt = alpaca_prompt({**row, _col(columns, "output"): ""}, columns)[0]
        else:
            messages = (sharegpt_messages if fmt == "sharegpt" else messages_messages)(row, columns)
            prompt, reply = conversation_prompt(messages, "the conversation")
            extra.pop(_col(columns, "conversations" if fmt == "sharegpt" else "messages"), None)
            if reply is not None:
                extra.setdefault(REFERENCE_COLUMN, reply)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    shadowed = [k for k in extra if k in RESERVED_COLUMNS or k == "prompt"]
    if shadowed:
        raise DataError(f"{where}: column '{shadowed[0]}' has the name of an argument TRL gives every reward "
                        f"function ({', '.join(('prompt',) + RESERVED_COLUMNS)}); rename it in the data")
    return {"prompt": prompt, **extra}


def checked_prompt(row: dict[str, Any], data: DataSpec, grpo: GrpoSpec, tokenizer: Any, where: str,
                   conversation: bool = False) -> dict[str, Any]:
    """prompt_row, then what needs the tokenizer and the rewards: a chat template for conversations, room for a
    whole completion, the columns the rewards read. `conversation`: the data's prompts are conversations (some
    source's are), so a text prompt is checked as the one user message it becomes (_as_conversations)."""
    chat = tokenizer.chat_template is not None
    out = prompt_row(row, data, chat, where)
    if conversation:
        _as_conversations([out])
    return _checked(out, data, grpo, tokenizer, where)


def _checked(out: dict[str, Any], data: DataSpec, grpo: GrpoSpec, tokenizer: Any, where: str) -> dict[str, Any]:
    if isinstance(out["prompt"], list) and tokenizer.chat_template is None:
        raise ConfigError(f"{where} is a conversation but the tokenizer has no chat template; set model.tokenizer "
                          "to one that has, or give the prompts as text")
    room = data.max_length - grpo.max_completion_length
    n = prompt_tokens(out["prompt"], tokenizer)
    if n > room:
        raise DataError(f"{where}: the prompt is {n} tokens; with method.grpo.maxCompletionLength "
                        f"{grpo.max_completion_length} the sequence could reach {n + grpo.max_completion_length}, "
                        f"above data.maxLength {data.max_length}; raise data.maxLength to at least "
                        f"{n + grpo.max_completion_length} or shorten the prompt")
    for index, name, column in reward_columns(grpo):
        if out.get(column) is None:
            present = sorted(k for k in out if k != "prompt")
            raise DataError(f"{where} has no '{column}' value, which method.grpo.rewards[{index}] ({name}) reads "
                            f"(other columns: {present}); add it, or set the reward's column")
        if grpo.rewards[index].type == "regex":  # each row's own pattern
            try:
                re.compile(str(out[column]))
            except re.error as exc:
                raise DataError(f"{where}: '{column}' is not a Python regular expression ({exc}), and "
                                f"method.grpo.rewards[{index}] ({name}) searches completions with it") from exc
    out[ROW_COLUMN] = where
    return out


def _rows(parts: list[Part], data: DataSpec, tokenizer: Any, limit: int | None) -> tuple[list[dict], int]:
    """Each row as prompt_row reads it (not checked yet: its layout is the whole data's), with ROW_COLUMN."""
    chat = tokenizer.chat_template is not None
    rows: list[dict[str, Any]] = []
    seen = 0
    for part in parts:
        for i, row in enumerate(part.rows):
            if limit is not None and len(rows) >= limit:
                return rows, seen
            seen += 1
            where = f"{part.name}, row {i + 1}"
            rows.append({**prompt_row(row, data, chat, where), ROW_COLUMN: where})
    return rows, seen


def _as_conversations(rows: list[dict[str, Any]]) -> None:
    """A text prompt becomes one user message: a dataset column has one type, and the model must see every prompt,
    training and held out, through the same template."""
    for r in rows:
        if isinstance(r["prompt"], str):
            r["prompt"] = [{"role": "user", "content": r["prompt"]}]


def _check_all(rows: list[dict[str, Any]], data: DataSpec, grpo: GrpoSpec, tokenizer: Any) -> list[dict]:
    """The checks on each prompt as TRL will read it (after _as_conversations)."""
    return [_checked(r, data, grpo, tokenizer, r[ROW_COLUMN]) for r in rows]


def _dataset(rows: list[dict[str, Any]]) -> Any:
    import datasets

    try:
        return datasets.Dataset.from_list(rows)
    except Exception as exc:  # pyarrow's errors name neither the row nor the column
        raise DataError(f"the prompts' columns cannot form one table (a column holds different types in different "
                        f"rows?): {str(exc).splitlines()[0][:300]}") from exc


def prepare_prompts(data: DataSpec, grpo: GrpoSpec, tokenizer: Any, seed: int) -> PreparedData:
    """Checked prompts as datasets (train, and validation from data.validation or the split percentage)."""
    train_rows, seen = _rows(load_rows(data.train, data), data, tokenizer, data.max_train_samples)
    if not train_rows:
        raise DataError(f"the {data.format} data has no rows")
    eval_rows, eval_seen = (_rows(load_rows(data.validation, data), data, tokenizer, data.max_eval_samples)
                            if data.validation else ([], 0))
    if any(isinstance(r["prompt"], list) for r in train_rows + eval_rows):
        _as_conversations(train_rows + eval_rows)
    train = _dataset(_check_all(train_rows, data, grpo, tokenizer))
    evaluation = None
    stats: dict[str, dict[str, int]] = {"train": {"rows": seen, "prompts": len(train_rows)}}
    if data.validation:
        evaluation = _dataset(_check_all(eval_rows, data, grpo, tokenizer))
        stats["validation"] = {"rows": eval_seen, "prompts": len(eval_rows)}
    elif data.validation_split_percentage > 0:
        split = train.train_test_split(test_size=data.validation_split_percentage / 100, seed=seed)
        train, evaluation = split["train"], split["test"]
        if data.max_eval_samples is not None:
            evaluation = evaluation.select(range(min(len(evaluation), data.max_eval_samples)))
        stats["train"]["prompts"], stats["validation"] = len(train), {"prompts": len(evaluation)}
    return PreparedData(train=train, eval=evaluation, stats=stats)
