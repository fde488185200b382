"""Each data format -> what the model is trained on: a conversation (a list of role/content messages, rendered by
the chat template) or a prompt and a completion. Rows that cannot be read as their format are DataErrors that say
what is wrong; the caller adds the file and the row."""

from typing import Any

from finetune_operator.api.data import ColumnMapping
from finetune_trainer.errors import DataError

Message = dict[str, str]

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
                  "tool": "tool", "function_call": "assistant", "observation": "tool", "function": "tool"}


def _col(columns: ColumnMapping, name: str) -> str:
    return getattr(columns, name) or name


def _field(row: dict[str, Any], column: str, required: bool = True) -> str:
    value = row.get(column)
    if value is None:
        if required:
            raise DataError(f"row has no '{column}' value (columns: {sorted(k for k in row if not k.startswith('_'))})"
                            "; map it with data.columns")
        return ""
    if not isinstance(value, str | int | float):
        raise DataError(f"column '{column}' holds a {type(value).__name__}, expected text")
    return str(value)


def content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI-style parts [{"type": "text", "text": ...}] joined.
    null, other part types (images, audio) and other values are errors: never trained as "None" or a repr."""
    if isinstance(content, str):
        return content
    if content is None:
        raise DataError(f"{where} has no content (null); give it text, or drop the message")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise DataError(f"{where}, content part {j + 1}: type {kind!r} is not supported (text only: "
                                '{"type": "text", "text": "..."})')
            texts.append(part["text"])
        return "".join(texts)
    raise DataError(f"{where} has content of type {type(content).__name__}; expected text or a list of text parts")


def alpaca_messages(row: dict[str, Any], columns: ColumnMapping) -> list[Message]:
    instruction = _field(row, _col(columns, "instruction"))
    extra = _field(row, _col(columns, "input"), required=False)
    system = _field(row, _col(columns, "system"), required=False)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user},
                       {"role": "assistant", "content": _field(row, _col(columns, "output"))}]


def alpaca_prompt(row: dict[str, Any], columns: ColumnMapping) -> tuple[str, str]:
    """The classic Alpaca prompt and the response, for tokenizers without a chat template."""
    instruction = _field(row, _col(columns, "instruction"))
    extra = _field(row, _col(columns, "input"), required=False)
    prompt = (ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=extra) if extra
              else ALPACA_PROMPT.format(instruction=instruction))
    return prompt, _field(row, _col(columns, "output"))


def sharegpt_messages(row: dict[str, Any], columns: ColumnMapping) -> list[Message]:
    column = _col(columns, "conversations")
    turns = row.get(column)
    if not isinstance(turns, list) or not turns:
        raise DataError(f"sharegpt row needs a non-empty '{column}' list")
    messages = []
    system = _field(row, _col(columns, "system"), required=False)
    if system:
        messages.append({"role": "system", "content": system})
    for i, turn in enumerate(turns):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        role = SHAREGPT_ROLES.get(str(speaker).lower()) if speaker is not None else None
        if role is None:
            raise DataError(f"turn {i + 1} has an unknown 'from': {speaker!r} (known: {', '.join(SHAREGPT_ROLES)})")
        value = turn.get("value")
        messages.append({"role": role, "content": value if type(value) is str else
                         content_text(value, f"turn {i + 1} ({speaker})")})
    return messages


def messages_messages(row: dict[str, Any], columns: ColumnMapping) -> list[Message]:
    column = _col(columns, "messages")
    turns = row.get(column)
    if not isinstance(turns, list) or not turns:
        raise DataError(f"messages row needs a non-empty '{column}' list")
    out = []
    for i, turn in enumerate(turns):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ROLES:
            raise DataError(f"message {i + 1} has an unknown role: {role!r} (known: {', '.join(ROLES)})")
        content = turn.get("content")  # text, the common case, skips building the error's wording
        out.append({"role": role, "content": content if type(content) is str else
                    content_text(content, f"message {i + 1} ({role})")})
    return out


def prompt_completion(row: dict[str, Any], columns: ColumnMapping) -> tuple[str, str]:
    return _field(row, _col(columns, "prompt")), _field(row, _col(columns, "completion"))


CHAT_FORMATS = {"alpaca": alpaca_messages, "sharegpt": sharegpt_messages, "messages": messages_messages}
