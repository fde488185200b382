"""Conversations -> token ids and labels exactly as the model sees them at inference.

One render of the whole conversation by the tokenizer's own chat template and one tokenization of that text, so
the ids equal `apply_chat_template(messages, tokenize=True)`: no BOS the template does not write, no token split at
a message boundary that one-call tokenization would not make (plus, where a template writes no stop after the last
reply, the stop it closes other replies with: GLM's next-turn token). Labels come from character spans of the rendered
text: each assistant reply and the end-of-turn token the template writes after it are learned, everything else
gets IGNORE_INDEX.

The spans come from the template's own `{% generation %}` markers when it has them
(`return_assistant_tokens_mask`); otherwise each message's content is found, in order, in the rendered text, and
the assistant's span runs on through the template's end-of-turn token. That token is read off the template itself
by rendering a probe conversation once. Prefix rendering is not used: templates that re-render history (Qwen3 and
DeepSeek-R1 drop earlier reasoning), refuse a system message alone or a conversation without a user query render
whole conversations fine.
"""

import re
from dataclasses import dataclass
from typing import Any

from .errors import DataError

IGNORE_INDEX = -100
Message = dict[str, str]
# The fallback for tokenizers without a chat template (saved with the trained model, so inference renders the same):
# ChatML turns, with the tokenizer's real EOS closing every turn, so the model learns to stop with a token that
# generation stops at.
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_GENERATION_MARKER = re.compile(r"{%-?\s*generation\s*-?%}")
_PROBE = [{"role": "user", "content": "Ask0x1"}, {"role": "assistant", "content": "Reply0x1"},
          {"role": "user", "content": "Ask0x2"}, {"role": "assistant", "content": "Reply0x2"}]


def template_name(tokenizer: Any) -> str:
    """Which template a message should name: the model (or tokenizer) it came with."""
    return str(getattr(tokenizer, "name_or_path", "") or "the tokenizer")


@dataclass(frozen=True)
class ChatEncoder:
    """Encodes conversations with one tokenizer and template; build it once per tokenizer (it probes the template)."""

    tokenizer: Any
    template: str
    end_markers: tuple[str, ...]
    generation_marked: bool
    # The stop written after a conversation's last reply when the template writes none there: GLM-4's templates end
    # a reply only by opening the next turn (<|user|>, a stop in its generation_config), so single-turn data would
    # never teach the model to stop. GLM's own fine-tuning appends that token; so do we.
    final_stop: str = ""

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, template: str | None = None) -> "ChatEncoder":
        template = template or tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE
        encoder = cls(tokenizer, template, (), bool(_GENERATION_MARKER.search(template)))
        markers, final_stop = encoder._probe_end_markers()
        return cls(tokenizer, template, markers, encoder.generation_marked, final_stop)

    def render(self, messages: list[Message]) -> tuple[str, list[Message]]:
        """The whole conversation as the template writes it, and the messages it rendered: a system message the
        template refuses is folded into the first user turn (what Gemma-style templates expect users to do)."""
        try:
            return self._closed(self._render(messages), messages), messages
        except DataError:
            folded = fold_system(messages)
            if folded is None:
                raise
            return self._closed(self._render(folded), folded), folded

    def _closed(self, text: str, messages: list[Message]) -> str:
        """`text` with the final stop after a last assistant reply, for templates that write none there."""
        if self.final_stop and messages and messages[-1]["role"] == "assistant":
            return text + self.final_stop
        return text

    def encode(self, messages: list[Message], train_on_prompt: bool = False) -> tuple[list[int], list[int]]:
        return self.encode_many([messages], train_on_prompt)[0]

    def encode_many(self, conversations: list[list[Message]], train_on_prompt: bool = False
                    ) -> list[tuple[list[int], list[int]]]:
        """Several conversations, rendered and tokenized in one call each (the tokenizer's batch encoding)."""
        if self.generation_marked:
            return [self._encode_marked(messages, train_on_prompt) for messages in conversations]
        rendered = self.render_many(conversations)
        texts = [text for text, _ in rendered]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        out = []
        if backend is not None:  # the Rust tokenizer itself: what tokenizer(texts) runs, minus Python conversions
            for (text, messages), encoding in zip(rendered, backend.encode_batch(texts, add_special_tokens=False),
                                                  strict=True):
                ids = encoding.ids
                out.append((ids, list(ids) if train_on_prompt else
                            labels_of_encoding(encoding, self.assistant_spans(text, messages))))
            return out
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        for (text, messages), ids, offsets in zip(rendered, encoded["input_ids"], encoded["offset_mapping"],
                                                  strict=True):
            ids = list(ids)
            out.append((ids, list(ids) if train_on_prompt else
                        labels_from_spans(ids, offsets, self.assistant_spans(text, messages))))
        return out

    def render_many(self, conversations: list[list[Message]]) -> list[tuple[str, list[Message]]]:
        """One render call for all (the template compiled once); one by one when the template refuses one."""
        from jinja2 import TemplateError

        if len(conversations) < 2:
            return [self.render(messages) for messages in conversations]
        try:
            texts = self.tokenizer.apply_chat_template(conversations, chat_template=self.template, tokenize=False)
        except TemplateError:  # one of them was refused: render one by one to fold it or to say which
            return [self.render(messages) for messages in conversations]
        return [(self._closed(str(t), m), m) for t, m in zip(texts, conversations, strict=True)]

    def _encode_marked(self, messages: list[Message], train_on_prompt: bool) -> tuple[list[int], list[int]]:
        _, rendered = self.render(messages)
        out = self.tokenizer.apply_chat_template(rendered, chat_template=self.template, tokenize=True,
                                                 return_dict=True, return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        labels = [t if m else IGNORE_INDEX for t, m in zip(ids, out["assistant_masks"], strict=True)]
        return ids, (list(ids) if train_on_prompt else labels)

    def assistant_spans(self, text: str, messages: list[Message]) -> list[tuple[int, int]]:
        """Character spans of the assistant replies (with their end-of-turn token) in the rendered text."""
        spans, cursor = [], 0
        for i, message in enumerate(messages):
            found = _locate(text, message["content"], cursor)
            if found is None:
                if message["role"] == "assistant":
                    raise DataError(f"the chat template of {template_name(self.tokenizer)} does not render assistant "
                                    f"message {i + 1} verbatim, so its tokens cannot be told apart; use format "
                                    "prompt_completion, or a tokenizer whose template has {% generation %} markers")
                continue
            start, end = found
            if message["role"] == "assistant":
                spans.append((start, self._through_end_marker(text, end)))
            cursor = end
        return spans

    def _through_end_marker(self, text: str, end: int) -> int:
        position = end
        while position < len(text) and text[position] in " \t\n":  # Llama-2 writes ' ' + eos after a reply
            position += 1
        for marker in self.end_markers:
            if text.startswith(marker, position):
                return position + len(marker)
        return end

    def _render(self, messages: list[Message]) -> str:
        from jinja2 import TemplateError

        try:
            return str(self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False))
        except TemplateError as exc:
            raise DataError(f"the chat template of {template_name(self.tokenizer)} refused the conversation: {exc}"
                            ) from None

    def _probe_end_markers(self) -> tuple[tuple[str, ...], str]:
        """What the template writes to close an assistant turn, read off a probe conversation: the run of special
        tokens after a reply, minus the next turn's header (e.g. <|im_end|>, <|eot_id|>, </s>; Cohere's
        <|END_RESPONSE|><|END_OF_TURN_TOKEN|>; GPT-OSS closes history with <|end|> and the last reply with
        <|return|>). These are what the model must learn to emit, and generation stops at them. Second: the
        final stop to append when the template closes a reply only by opening the next turn (GLM)."""
        unreadable = ((self.tokenizer.eos_token,) if self.tokenizer.eos_token else (), "")  # the EOS, no final stop
        try:
            text = self._render(_PROBE)
        except DataError:
            return unreadable
        specials = sorted(_special_tokens(self.tokenizer), key=len, reverse=True)
        ask1, reply1, ask2, reply2 = (text.find(m["content"]) for m in _PROBE)
        if min(ask1, reply1, ask2, reply2) < 0:
            return unreadable
        between = text[reply1 + len(_PROBE[1]["content"]):ask2]
        header = _common_suffix(between, text[:ask1])  # the next user turn's header, as the first one is written
        closing = _special_run(between[:len(between) - len(header)], specials)
        next_role = "" if closing else _special_run(between, specials, first_only=True)  # GLM: <|user|> stops
        last = _special_run(text[reply2 + len(_PROBE[3]["content"]):], specials)
        markers = tuple(sorted({m for m in (closing or next_role, last) if m}, key=len, reverse=True))
        return markers, next_role if next_role and not last else ""


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return a[len(a) - n:]


def _special_run(text: str, specials: list[str], first_only: bool = False) -> str:
    """The special tokens at the start of `text` (after whitespace), up to the first other character."""
    rest = text.lstrip()
    run = ""
    while True:
        token = next((s for s in specials if rest.startswith(s)), None)
        if token is None:
            return run
        run, rest = run + token, rest[len(token):]
        if first_only:
            return run


def fold_system(messages: list[Message]) -> list[Message] | None:
    """The system prompt moved into the first user message, or None when there is nothing to fold."""
    if not messages or messages[0]["role"] != "system" or len(messages) < 2 or messages[1]["role"] != "user":
        return None
    first = {"role": "user", "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}
    return [first, *messages[2:]]


def labels_of_encoding(encoding: Any, spans: list[tuple[int, int]]) -> list[int]:
    """labels_from_spans for a tokenizers Encoding: each span's first and last token by character lookup, so the
    cost is per span, not per token."""
    ids = encoding.ids
    labels = [IGNORE_INDEX] * len(ids)
    for start, end in spans:
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1) if end > start else None
        if first is None or last is None:  # a character no token covers (normalized away): the general way
            return labels_from_spans(ids, encoding.offsets, spans)
        labels[first:last + 1] = ids[first:last + 1]
    return labels


def labels_from_spans(ids: list[int], offsets: Any, spans: list[tuple[int, int]]) -> list[int]:
    """A token is learned when its characters overlap a trainable span (a SentencePiece "▁word" token that starts
    with the prompt's space and carries the reply's first word is learned: the model must produce it)."""
    import numpy as np

    if not ids:
        return []
    bounds = np.asarray(offsets, dtype=np.int64).reshape(len(ids), 2)
    learned = np.zeros(len(ids), dtype=bool)
    for start, end in spans:
        learned |= (bounds[:, 0] < end) & (bounds[:, 1] > start)
    return np.where(learned, np.asarray(ids, dtype=np.int64), IGNORE_INDEX).tolist()


def _locate(text: str, content: str, cursor: int) -> tuple[int, int] | None:
    """Where `content` is rendered at or after `cursor`: verbatim, trimmed (Llama and Gemma templates trim), or,
    for a reply with reasoning the template drops from history, the part after </think>."""
    candidates = [content, content.strip()]
    if "</think>" in content:
        candidates.append(content.rsplit("</think>", 1)[1].strip())
    for candidate in candidates:
        if not candidate:
            continue
        at = text.find(candidate, cursor)
        if at >= 0:
            return at, at + len(candidate)
    return (cursor, cursor) if not content.strip() else None


def _special_tokens(tokenizer: Any) -> set[str]:
    tokens = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        tokens.add(str(getattr(added, "content", added)))
    return {t for t in tokens if t}
