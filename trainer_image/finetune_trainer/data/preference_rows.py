"""One row of preference data -> what TRL's trainers read: a pair {prompt, chosen, rejected} (TRL's layout, or
LLaMA-Factory's alpaca and sharegpt pair layouts) or an unpaired example {prompt, completion, label} (KTO), as text or
as conversations. A row TRL would train wrongly or drop without a word is a DataError saying why, which columns the
row has and the fix (the caller names the file and line)."""

from typing import Any

from finetune_operator.api.data import ColumnMapping
from finetune_trainer.data.formats import _col, _field, content_text, sharegpt_messages
from finetune_trainer.errors import DataError

Turns = list[dict[str, str]]
# Columns of the SFT layouts (a file for data.format alpaca, messages, prompt_completion, sharegpt or text), for the
# fix when such a row is given to a preference objective.
SFT_LAYOUTS = (("output", "alpaca"), ("messages", "messages"), ("completion", "prompt_completion"),
               ("conversations", "sharegpt"), ("text", "text"))


def columns_of(row: dict[str, Any]) -> list[str]:
    """The columns a row really has: datasets gives every row every column of its file, a missing one as null."""
    return sorted(k for k, v in row.items() if not k.startswith("_") and v is not None)


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


def _answer(turns: Turns, where: str, key: str) -> Turns:
    """An answer is what the model says: assistant messages with some text. TRL trains whatever the messages are:
    a user turn as the model's own words, an empty reply as a preference for saying nothing."""
    for j, message in enumerate(turns):
        if message["role"] != "assistant":
            raise DataError(f"{where}, message {j + 1} has role {message['role']!r}: the {key} answer is what the "
                            "model says, so its messages have role assistant; move the other turns into the prompt")
    if not "".join(m["content"] for m in turns).strip():
        raise DataError(f"{where}: the {key} answer is empty; give it text, or drop the row")
    return turns


def _sft_fix(row: dict[str, Any], columns: ColumnMapping, needs: str) -> str | None:
    """The fix for a row of an SFT layout given to a preference objective (one answer per prompt, no second one)."""
    for name, layout in SFT_LAYOUTS:
        if row.get(_col(columns, name)) is not None:
            return (f"it looks like SFT data (data.format {layout}: one answer per prompt), and a preference "
                    f"objective needs {needs}; train it with method.objective sft and data.format {layout}, or add "
                    "the missing column to every row")
    return None


def _missing(row: dict[str, Any], columns: ColumnMapping, key: str, where: str) -> DataError | None:
    """The error for a row whose `key` column (as data.columns maps it) is absent or blank, else None."""
    column = _col(columns, key)
    value = row.get(column)
    if value is not None and not (isinstance(value, str) and not value.strip()):
        return None
    if value is not None:
        return DataError(f"{where}: the {key} answer ('{column}') is empty; give it text, or drop the row")
    needs = ("a chosen and a rejected answer" if key in ("chosen", "rejected") else
             "a completion labelled desirable or not" if key == "completion" else "a prompt")
    fix = _sft_fix(row, columns, needs) or f"map it with data.columns.{key}"
    return DataError(f"{where} has no '{column}' ({key}) value (columns: {columns_of(row)}); {fix}")


def _texts(row: dict[str, Any], columns: ColumnMapping, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """The row's prompt and answers, all text or all conversations."""
    names = {k: _col(columns, k) for k in keys}
    values = {}
    for key, column in names.items():
        missing = _missing(row, columns, key, where)
        if missing is not None:
            raise missing
        values[key] = row[column]
    conversational = any(isinstance(v, list) for v in values.values())
    if not conversational:
        bad = [k for k, v in values.items() if not isinstance(v, str | int | float)]
        if bad:
            raise DataError(f"{where}, {names[bad[0]]}: a {type(values[bad[0]]).__name__}, expected text or messages")
        return {k: str(v) for k, v in values.items()}
    out = {}
    for key, value in values.items():
        role = "user" if key == "prompt" else "assistant"
        turns = [{"role": role, "content": value}] if isinstance(value, str) else _turns(value, f"{where}, "
                                                                                                 f"{names[key]}")
        out[key] = turns if key == "prompt" else _answer(turns, f"{where}, {names[key]}", key)
    return out


def preference_row(row: dict[str, Any], columns: ColumnMapping, where: str) -> dict[str, Any]:
    """One row -> {prompt, chosen, rejected}, all text or all conversations (text answers to a conversational
    prompt become one assistant message; a text prompt to conversational answers one user message). TRL's layout,
    or LLaMA-Factory's alpaca and sharegpt ones."""
    factory = llamafactory_pair(row, columns, where)
    if factory is not None:
        for key in ("chosen", "rejected"):  # named as the file's columns, not as the pair built from them
            missing = _missing(row, columns, key, where)
            if missing is not None:
                raise missing
        out = _texts(factory, ColumnMapping(), ("prompt", "chosen", "rejected"), where)
    else:
        out = _texts(row, columns, ("prompt", "chosen", "rejected"), where)
    if out["chosen"] == out["rejected"]:
        raise DataError(f"{where}: chosen and rejected are the same answer, so there is nothing to prefer; fix or "
                        "drop the row")
    return out


def llamafactory_pair(row: dict[str, Any], columns: ColumnMapping, where: str) -> dict[str, Any] | None:
    """LLaMA-Factory's preference layouts (its dataset_info.json `ranking: true`) as TRL's: alpaca (instruction,
    input, chosen and rejected as text, optional system and history of [query, response] pairs) and sharegpt
    (conversations of from/value turns, chosen and rejected each one from/value turn, optional system). The prompt
    is the conversation LLaMA-Factory's own converters build (instruction and input joined by one newline), which
    the chat template then renders. None for a row with a prompt column: TRL's layout."""
    if row.get(_col(columns, "prompt")) is not None:
        return None
    chosen, rejected = row.get(_col(columns, "chosen")), row.get(_col(columns, "rejected"))
    conversations, instruction = _col(columns, "conversations"), _col(columns, "instruction")
    try:
        if isinstance(row.get(conversations), list):
            prompt = sharegpt_messages(row, columns)
            chosen, rejected = (_sharegpt_answer(answer, _col(columns, key)) for answer, key in
                                ((chosen, "chosen"), (rejected, "rejected")))
        elif row.get(instruction) is not None:
            prompt = _alpaca_prompt(row, columns)
        else:
            return None
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _alpaca_prompt(row: dict[str, Any], columns: ColumnMapping) -> Turns:
    """LLaMA-Factory's AlpacaDatasetConverter: system, the history's turns, then instruction and input as one user
    message, joined by a newline."""
    user = "\n".join(part for part in (_field(row, _col(columns, "instruction")),
                                       _field(row, _col(columns, "input"), required=False)) if part)
    system = _field(row, _col(columns, "system"), required=False)
    history = row.get("history") or []
    if not isinstance(history, list) or not all(isinstance(h, list | tuple) and len(h) == 2 for h in history):
        raise DataError("'history' is not a list of [query, response] pairs")
    past = [{"role": role, "content": str(text)} for query, response in history
            for role, text in (("user", query), ("assistant", response))]
    return [{"role": "system", "content": system}] * bool(system) + past + [{"role": "user", "content": user}]


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
        raise DataError(f"{where}: '{column}' (label) is {value!r}; expected true or false (1/0, yes/no) saying "
                        f"whether the completion is desirable (columns: {columns_of(row)}); map it with "
                        "data.columns.label")
    return out
