"""Each data format -> segments: a list of (text, trainable). Tokenizing segments separately is what lets the
prompt, the user turns and the system prompt get label -100 while every assistant reply (and its EOS) is learned."""

from collections.abc import Callable
from typing import Any

from finetune_operator.api.data import ColumnMapping

from .errors import DataError

Segments = list[tuple[str, bool]]
Message = dict[str, str]

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
# Used when the tokenizer has no chat template of its own (ChatML, the most common convention).
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


def _col(columns: ColumnMapping, name: str) -> str:
    return getattr(columns, name) or name


def _field(row: dict[str, Any], column: str, required: bool = True) -> str:
    value = row.get(column)
    if value is None:
        if required:
            raise DataError(f"row has no '{column}' column (columns: {sorted(row)}); map it with data.columns")
        return ""
    return str(value)


def chat_segments(messages: list[Message], render: Callable[..., str]) -> Segments:
    """Splits a rendered conversation at message boundaries by rendering each prefix: the text that the
    generation prompt adds is prompt, the assistant's own text (up to and including its end token) is trainable."""
    segments: Segments = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            prompt = render(messages[:i], add_generation_prompt=True)
            full = render(messages[: i + 1], add_generation_prompt=False)
            if not prompt.startswith(done) or not full.startswith(prompt):
                raise DataError("the chat template does not render conversations as growing prefixes; "
                                "use format prompt_completion or another template")
            segments += [(prompt[len(done):], False), (full[len(prompt):], True)]
        else:
            full = render(messages[: i + 1], add_generation_prompt=False)
            if not full.startswith(done):
                raise DataError("the chat template does not render conversations as growing prefixes")
            segments.append((full[len(done):], False))
        done = full
    return [(text, trainable) for text, trainable in segments if text]


def alpaca_messages(row: dict[str, Any], columns: ColumnMapping) -> list[Message]:
    instruction = _field(row, _col(columns, "instruction"))
    extra = _field(row, _col(columns, "input"), required=False)
    system = _field(row, _col(columns, "system"), required=False)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user},
                       {"role": "assistant", "content": _field(row, _col(columns, "output"))}]


def alpaca_plain_segments(row: dict[str, Any], columns: ColumnMapping, eos: str) -> Segments:
    instruction = _field(row, _col(columns, "instruction"))
    extra = _field(row, _col(columns, "input"), required=False)
    prompt = (ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=extra) if extra
              else ALPACA_PROMPT.format(instruction=instruction))
    return [(prompt, False), (_field(row, _col(columns, "output")) + eos, True)]


def sharegpt_messages(row: dict[str, Any], columns: ColumnMapping) -> list[Message]:
    turns = row.get(_col(columns, "conversations"))
    if not isinstance(turns, list) or not turns:
        raise DataError(f"sharegpt row needs a non-empty '{_col(columns, 'conversations')}' list")
    messages = []
    system = _field(row, _col(columns, "system"), required=False)
    if system:
        messages.append({"role": "system", "content": system})
    for turn in turns:
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            raise DataError(f"sharegpt turn has an unknown 'from': {turn.get('from')!r}")
        messages.append({"role": role, "content": str(turn.get("value", ""))})
    return messages


def messages_messages(row: dict[str, Any], columns: ColumnMapping) -> list[Message]:
    turns = row.get(_col(columns, "messages"))
    if not isinstance(turns, list) or not turns:
        raise DataError(f"messages row needs a non-empty '{_col(columns, 'messages')}' list")
    out = []
    for turn in turns:
        if turn.get("role") not in ("system", "user", "assistant", "tool"):
            raise DataError(f"message has an unknown role: {turn.get('role')!r}")
        out.append({"role": turn["role"], "content": str(turn.get("content", ""))})
    return out


def prompt_completion_segments(row: dict[str, Any], columns: ColumnMapping, eos: str) -> Segments:
    return [(_field(row, _col(columns, "prompt")), False), (_field(row, _col(columns, "completion")) + eos, True)]
