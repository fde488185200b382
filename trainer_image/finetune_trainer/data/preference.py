"""Preference data, in the layouts TRL's trainers read (TRL applies the chat template to conversations and
tokenizes): pairs (data.format preference: prompt, chosen, rejected; or LLaMA-Factory's alpaca and sharegpt pair
layouts) and unpaired examples (data.format unpaired: prompt, completion, label; KTO), as text or as conversations
(lists of role/content messages). Every row is checked
before training, with the file and row of a bad one (exit 65): a missing answer, an answer that is not text or
messages, chosen and rejected the same, a label that is not a yes or a no, a prompt that leaves no room for an
answer within data.maxLength."""

from typing import Any

from finetune_operator.api.data import ColumnMapping, DataSpec
from finetune_trainer.data.formats import _col, alpaca_messages, content_text, sharegpt_messages
from finetune_trainer.data.loading import Part, load_rows
from finetune_trainer.data.prepared import PreparedData
from finetune_trainer.errors import ConfigError, DataError

Turns = list[dict[str, str]]


def _turns(value: Any, where: str) -> Turns:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where} is {type(value).__name__ if value is not None else 'null'}: expected text or a "
                        "non-empty list of role/content messages")
    turns = []
    for j, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise DataError(f"{where}, message {j + 1}: expected {{\"role\": ..., \"content\": ...}}")
        turns.append({"role": message["role"], "content": content_text(message.get("content"),
                                                                         f"{where}, message {j + 1}")})
    return turns


def preference_row(row: dict[str, Any], columns: ColumnMapping, where: str) -> dict[str, Any]:
    """One row -> {prompt, chosen, rejected}, all text or all conversations (text answers to a conversational
    prompt become one assistant message; a text prompt to conversational answers one user message). TRL's layout,
    or LLaMA-Factory's alpaca and sharegpt ones."""
    factory = llamafactory_pair(row, columns, where)
    out = _texts(*(factory, ColumnMapping()) if factory is not None else (row, columns),
                 ("prompt", "chosen", "rejected"), where)
    if out["chosen"] == out["rejected"]:
        raise DataError(f"{where}: chosen and rejected are the same answer, so there is nothing to prefer; fix or "
                        "drop the row")
    return out


def llamafactory_pair(row: dict[str, Any], columns: ColumnMapping, where: str) -> dict[str, Any] | None:
    """LLaMA-Factory's preference layouts (its dataset_info.json `ranking: true`) as TRL's: alpaca (instruction,
    input, chosen and rejected as text, optional system and history of [query, response] pairs) and sharegpt
    (conversations of from/value turns, chosen and rejected each one from/value turn, optional system). The prompt
    is a conversation built as our SFT builds it from the same layout (the chat template then renders it as in
    SFT). None for a row with a prompt column: TRL's layout."""
    if _col(columns, "prompt") in row:
        return None
    chosen, rejected = row.get(_col(columns, "chosen")), row.get(_col(columns, "rejected"))
    conversations, instruction = _col(columns, "conversations"), _col(columns, "instruction")
    try:
        if isinstance(row.get(conversations), list):
            prompt = sharegpt_messages(row, columns)
            chosen, rejected = (_sharegpt_answer(answer, _col(columns, key)) for answer, key in
                                ((chosen, "chosen"), (rejected, "rejected")))
        elif instruction in row:
            prompt = alpaca_messages({**row, _col(columns, "output"): ""}, columns)[:-1]
            history = row.get("history") or []
            if not isinstance(history, list) or not all(isinstance(h, list | tuple) and len(h) == 2
                                                        for h in history):
                raise DataError("'history' is not a list of [query, response] pairs")
            past = [{"role": role, "content": str(text)} for query, response in history
                    for role, text in (("user", query), ("assistant", response))]
            system = [m for m in prompt if m["role"] == "system"]
            prompt = system + past + [m for m in prompt if m["role"] != "system"]
        else:
            return None
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _sharegpt_answer(turn: Any, column: str) -> Any:
    """A sharegpt answer: one {from, value} turn (a string or a list of turns passes through as they are)."""
    if isinstance(turn, dict):
        if "value" not in turn:
            raise DataError(f"'{column}' is a turn without a 'value': {sorted(turn)}")
        return [{"role": "assistant", "content": content_text(turn["value"], f"'{column}'")}]
    return turn


YES, NO = ("true", "1", "yes", "y", "desirable"), ("false", "0", "no", "n", "undesirable")


def unpaired_row(row: dict[str, Any], columns: ColumnMapping, where: str) -> dict[str, Any]:
    """One row -> {prompt, completion, label}, the label a bool (CSV and JSON spell it in many ways)."""
    out = _texts(row, columns, ("prompt", "completion"), where)
    column = columns.label or "label"
    value = row.get(column)
    spelled = str(value).strip().lower()
    if value is True or value == 1 or (isinstance(value, str) and spelled in YES):
        out["label"] = True
    elif value is False or value == 0 or (isinstance(value, str) and spelled in NO):
        out["label"] = False
    else:
        present = sorted(k for k in row if not k.startswith("_"))
        raise DataError(f"{where}: '{column}' (label) is {value!r}; expected true or false (1/0, yes/no) saying "
                        f"whether the completion is desirable (columns: {present}); map it with data.columns.label")
    return out


def _texts(row: dict[str, Any], columns: ColumnMapping, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """The row's prompt and answers, all text or all conversations."""
    names = {k: _col(columns, k) for k in keys}
    values = {}
    for key, column in names.items():
        value = row.get(column)
        if value is None or (isinstance(value, str) and not value.strip()):
            present = sorted(k for k in row if not k.startswith("_"))
            raise DataError(f"{where} has no '{column}' ({key}) value (columns: {present}); map it with "
                            f"data.columns.{key}")
        values[key] = value
    conversational = any(isinstance(v, list) for v in values.values())
    if conversational:
        out = {}
        for key, value in values.items():
            role = "user" if key == "prompt" else "assistant"
            out[key] = ([{"role": role, "content": value}] if isinstance(value, str) else
                        _turns(value, f"{where}, {names[key]}"))
    else:
        bad = [k for k, v in values.items() if not isinstance(v, str | int | float)]
        if bad:
            raise DataError(f"{where}, {names[bad[0]]}: a {type(values[bad[0]]).__name__}, expected text or messages")
        out = {k: str(v) for k, v in values.items()}
    return out


def prompt_tokens(prompt: Any, tokenizer: Any) -> int:
    if isinstance(prompt, list):
        return len(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True))
    return len(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def checked_pair(row: dict[str, Any], data: DataSpec, tokenizer: Any, where: str) -> dict[str, Any]:
    """preference_row (unpaired_row for data.format unpaired), then what needs the tokenizer: a chat template for
    conversations, room for an answer."""
    pair = (unpaired_row if data.format == "unpaired" else preference_row)(row, data.columns, where)
    if isinstance(pair["prompt"], list) and tokenizer.chat_template is None:
        raise ConfigError(f"{where} is a conversation but the tokenizer has no chat template; set "
                          "model.tokenizer to one that has, or give the pairs as text")
    n = prompt_tokens(pair["prompt"], tokenizer)
    if n >= data.max_length:
        raise DataError(f"{where}: the prompt is {n} tokens, data.maxLength is {data.max_length}: no token "
                        "of the answer would be trained; raise data.maxLength or shorten the prompt")
    return pair


def _rows(parts: list[Part], data: DataSpec, tokenizer: Any, limit: int | None) -> tuple[list[dict], int]:
    rows: list[dict[str, Any]] = []
    seen = 0
    for part in parts:
        for i, row in enumerate(part.rows):
            if limit is not None and len(rows) >= limit:
                return rows, seen
            seen += 1
            rows.append(checked_pair(row, data, tokenizer, f"{part.name}, row {i + 1}"))
    return rows, seen


def for_kto(dataset: Any, seed: int) -> Any:
    """KTO's examples in an order whose batches mix desirable and undesirable ones. TRL's KTOTrainer samples in
    order (its KL estimate pairs each example with its neighbour's completion), so data sorted by label, or pairs
    unpaired as all chosen then all rejected, would train whole batches of one kind, and a pair's own answers would
    be neighbours. Each pair gives one of each; then one shuffle with training.seed."""
    import datasets

    if "chosen" in dataset.column_names:
        dataset = datasets.Dataset.from_list([
            {"prompt": row["prompt"], "completion": row[key], "label": key == "chosen"}
            for row in dataset for key in ("chosen", "rejected")])
    return dataset.shuffle(seed=seed).flatten_indices()


def prepare_preference(data: DataSpec, tokenizer: Any, seed: int, objective: str = "dpo") -> PreparedData:
    """Checked pairs (or unpaired examples) as datasets (train, and validation from data.validation or the split
    percentage); KTO's in an order it can train on (for_kto)."""
    import datasets

    train_rows, seen = _rows(load_rows(data.train, data), data, tokenizer, data.max_train_samples)
    if not train_rows:
        raise DataError(f"the {data.format} data has no rows")
    train = datasets.Dataset.from_list(train_rows)
    evaluation = None
    unit = "examples" if data.format == "unpaired" else "pairs"
    stats: dict[str, dict[str, int]] = {"train": {"rows": seen, unit: len(train_rows)}}
    if data.validation:
        eval_rows, eval_seen = _rows(load_rows(data.validation, data), data, tokenizer, data.max_eval_samples)
        evaluation = datasets.Dataset.from_list(eval_rows)
        stats["validation"] = {"rows": eval_seen, unit: len(eval_rows)}
    elif data.validation_split_percentage > 0:
        split = train.train_test_split(test_size=data.validation_split_percentage / 100, seed=seed)
        train, evaluation = split["train"], split["test"]
        if data.max_eval_samples is not None:
            evaluation = evaluation.select(range(min(len(evaluation), data.max_eval_samples)))
        stats["train"][unit], stats["validation"] = len(train), {unit: len(evaluation)}
    if objective == "kto":
        train = for_kto(train, seed)
        evaluation = for_kto(evaluation, seed) if evaluation is not None else None
        stats["train"]["examples"] = len(train)
        if evaluation is not None:
            stats["validation"]["examples"] = len(evaluation)
    return PreparedData(train=train, eval=evaluation, stats=stats)
