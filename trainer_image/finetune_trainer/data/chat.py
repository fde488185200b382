"""Conversations -> token ids and labels exactly as the model sees them at inference.

One render of the whole conversation by the tokenizer's own chat template and one tokenization of that text, so
the ids equal `apply_chat_template(messages, tokenize=True)`: no BOS the template does not write, no token split at
a message boundary that one-call tokenization would not make (plus, where a template writes no stop after the last
reply, the stop it closes other replies with: GLM's next-turn token).

Labels are what the model must generate after the generation prompt: for each assistant reply, the text the
template writes between the generation prompt and the reply (GPT-OSS's `<|channel|>final<|message|>`, Qwen3's
empty think block, the space after Vicuna's `ASSISTANT:`), the reply, and its end-of-turn token(s). Replies are
located structurally, never by searching for their text (a reply `a` or `end` also occurs in the template's own
turn markers): the template is rendered once per conversation shape (its roles, in order) with a unique placeholder
for every content, which gives the literal text between the contents, and the prefix that ends with the generation
prompt is rendered once per assistant turn of the shape; every conversation of that shape is then parsed against
those literal pieces. A template whose text depends on the contents themselves (Qwen3 moves a reply's reasoning,
DeepSeek drops it from history) is handled per row: the generation prompt is rendered for each reply and the label
starts where it ends.

Templates with `{% generation %}` markers are masked by their markers (`return_assistant_tokens_mask`).
"""

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from finetune_trainer.data.labels import IGNORE_INDEX, labels_from_spans, labels_of_encoding
from finetune_trainer.data.template_layout import (
    Layout,
    Message,
    common_prefix_length,
    common_suffix,
    common_suffix_length,
    last_special,
    placeholder,
    renderings,
    special_run,
    special_tokens,
    token_start,
)
from finetune_trainer.errors import DataError

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


class Encoded(NamedTuple):
    ids: list[int]
    labels: list[int]
    folded: bool  # the template refused the system message: it was folded into the first user turn


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
    # What the template writes right after a conversation's last reply (the stop generation must end at).
    last_stop: str = ""
    # Layouts by conversation shape (roles in order); None for a shape the template cannot lay out; the compiled
    # template. Not pickled: each worker process fills its own.
    _layouts: dict[tuple[str, ...], Layout | None] = field(default_factory=dict, compare=False, repr=False)
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, template: str | None = None) -> "ChatEncoder":
        template = template or tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE
        encoder = cls(tokenizer, template, (), bool(_GENERATION_MARKER.search(template)))
        markers, final_stop, last = encoder._probe_end_markers()
        return cls(tokenizer, template, markers, encoder.generation_marked, final_stop, last)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_layouts": {}, "_cache": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

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

    def stop_tokens(self) -> list[str]:
        """The tokens that end a reply as this template trains it: generation must stop at them."""
        return [t for t in (self.final_stop, self.last_stop) if t]

    def encode(self, messages: list[Message], train_on_prompt: bool = False) -> tuple[list[int], list[int]]:
        ids, labels, _ = self.encode_many([messages], train_on_prompt)[0]
        return ids, labels

    def encode_many(self, conversations: list[list[Message]], train_on_prompt: bool = False) -> list[Encoded]:
        """Several conversations, rendered and tokenized in one call each (the tokenizer's batch encoding)."""
        if self.generation_marked:
            return [self._encode_marked(messages, train_on_prompt) for messages in conversations]
        rendered = self.render_many(conversations)
        texts = [text for text, _ in rendered]
        folded = [len(messages) != len(original) for (_, messages), original in zip(rendered, conversations,
                                                                                    strict=True)]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        out = []
        if backend is not None:  # the Rust tokenizer itself: what tokenizer(texts) runs, minus Python conversions
            for (text, messages), encoding, fold in zip(rendered, backend.encode_batch(texts, add_special_tokens=False),
                                                        folded, strict=True):
                ids = encoding.ids  # a new list at every access: read once
                out.append(Encoded(ids, list(ids) if train_on_prompt else
                                   labels_of_encoding(encoding, self.learned_spans(text, messages), ids), fold))
            return out
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        for (text, messages), ids, offsets, fold in zip(rendered, encoded["input_ids"], encoded["offset_mapping"],
                                                        folded, strict=True):
            ids = list(ids)
            out.append(Encoded(ids, list(ids) if train_on_prompt else
                               labels_from_spans(ids, offsets, self.learned_spans(text, messages)), fold))
        return out

    def render_many(self, conversations: list[list[Message]]) -> list[tuple[str, list[Message]]]:
        """One render each with the template compiled once; one by one when the template refuses one."""
        from jinja2 import TemplateError

        if len(conversations) < 2:
            return [self.render(messages) for messages in conversations]
        try:
            texts = [self._render(messages, strict=False) for messages in conversations]
        except TemplateError:  # one of them was refused: render one by one to fold it or to say which
            return [self.render(messages) for messages in conversations]
        return [(self._closed(t, m), m) for t, m in zip(texts, conversations, strict=True)]

    def _encode_marked(self, messages: list[Message], train_on_prompt: bool) -> Encoded:
        _, rendered = self.render(messages)
        out = self.tokenizer.apply_chat_template(rendered, chat_template=self.template, tokenize=True,
                                                 return_dict=True, return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        labels = [t if m else IGNORE_INDEX for t, m in zip(ids, out["assistant_masks"], strict=True)]
        return Encoded(ids, list(ids) if train_on_prompt else labels, len(rendered) != len(messages))

    # --- where the model generates ------------------------------------------------------------------------------
    def learned_spans(self, text: str, messages: list[Message]) -> list[tuple[int, int]]:
        """Character spans of `text` (the render of `messages`) that the model generates: from the end of each
        reply's generation prompt through its end-of-turn token."""
        layout = self.layout(tuple(m["role"] for m in messages))
        spans = layout.spans(text, messages) if layout is not None else None
        return spans if spans is not None else self._spans_by_prefix(text, messages)

    def layout(self, roles: tuple[str, ...]) -> Layout | None:
        if roles not in self._layouts:
            self._layouts[roles] = self._lay_out(roles)
        return self._layouts[roles]

    def _lay_out(self, roles: tuple[str, ...]) -> Layout | None:
        messages = [{"role": role, "content": placeholder(i)} for i, role in enumerate(roles)]
        try:
            text = self._closed(self._render(messages), messages)
        except DataError:
            return None
        counts = [text.count(placeholder(i)) for i in range(len(messages))]
        if any(n > 1 for n in counts) or any(n == 0 and r == "assistant" for n, r in zip(counts, roles, strict=True)):
            return None  # a content written twice, or a reply left out: parse per row
        written = sorted((i for i, n in enumerate(counts) if n), key=lambda i: text.find(placeholder(i)))
        segments, cursor = [], 0
        for i in written:
            at = text.find(placeholder(i))
            segments.append(text[cursor:at])
            cursor = at + len(placeholder(i))
        segments.append(text[cursor:])
        learned = []
        for k, i in enumerate(written):
            if roles[i] == "assistant":
                head = text[:text.find(placeholder(i))]
                start = self._generation_start(messages[:i], head, len(head) - len(segments[k]), len(head))
                before = len(head) - start if start is not None else 0
                learned.append((k, before, self._end_of_turn(segments[k + 1], 0) or 0))
        return Layout(tuple(segments), tuple(learned), tuple(written))

    def _generation_start(self, prefix: list[Message], text: str, not_before: int, until: int) -> int | None:
        """Where, in `text` (a render that continues `prefix`), the model starts generating a reply that the
        template writes between `not_before` and `until`: the end of the generation prompt rendered after
        `prefix`. Where the template writes the history differently from the conversation so far (DeepSeek-R1
        opens <think> only at inference; Mistral writes the system prompt only into the last user turn), the
        prompt's end is aligned with the text by what precedes it; None when it cannot be."""
        try:
            prompt = self._render(prefix, add_generation_prompt=True)
        except DataError:
            return None
        if text.startswith(prompt) and not_before <= len(prompt) <= until:
            return len(prompt)
        try:
            bare = self._render(prefix)
        except DataError:
            bare = None
        common = token_start(text, common_prefix_length(prompt, text), special_tokens(self.tokenizer))
        if bare is not None and len(bare) <= common and not_before <= common <= until:
            return common  # the same history; they part inside the generation prompt
        for position in range(until, not_before - 1, -1):  # the template text before the reply, then one more
            if common_suffix_length(text, prompt, position) > position - not_before:
                return position
        # Last: what the prompt writes after the last message's content (Mistral's `[/INST]`), where it first
        # follows `not_before`.
        tail = self._prompt_tail(prefix)
        at = text.find(tail, not_before, until) if tail.strip() else -1
        return at + len(tail) if at >= 0 else None

    def _prompt_tail(self, prefix: list[Message]) -> str:
        """What the generation prompt writes after the last message's content (a placeholder marks where it ends)."""
        if not prefix:
            return ""
        marked = [*prefix[:-1], {**prefix[-1], "content": placeholder(len(prefix))}]
        try:
            prompt = self._render(marked, add_generation_prompt=True)
        except DataError:
            return ""
        at = prompt.rfind(placeholder(len(prefix)))
        return prompt[at + len(placeholder(len(prefix))):] if at >= 0 else ""

    def _spans_by_prefix(self, text: str, messages: list[Message]) -> list[tuple[int, int]]:
        """Per row, for a template that changes the text around a content: each reply is learned from the end of
        its own generation prompt (rendered for the conversation before it) through its end-of-turn token."""
        spans: list[tuple[int, int]] = []
        cursor = 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = self._generation_start(messages[:i], text, cursor, len(text))
            found = self._reply_at(text, message["content"], cursor if start is None else start)
            if found is None:
                raise DataError(f"the chat template of {template_name(self.tokenizer)} does not render assistant "
                                f"message {i + 1} verbatim, so its tokens cannot be told apart; use format "
                                "prompt_completion, or a tokenizer whose template has {% generation %} markers")
            spans.append((found[0] if start is None else start, found[1]))
            cursor = found[1]
        return spans

    def _reply_at(self, text: str, content: str, start: int) -> tuple[int, int] | None:
        """Where a reply written at or after `start` begins, and where its turn ends (through its end-of-turn
        token): verbatim, trimmed, or, for a reply whose reasoning the template moves, the part after </think>.
        Only an occurrence that its end-of-turn token follows counts (a short reply also occurs in the header that
        a template writes between the generation prompt and the reply, e.g. `final` in GPT-OSS's channel)."""
        candidates = renderings(content)
        if "</think>" in content:
            candidates.append(content.rsplit("</think>", 1)[1].strip())
        candidates = [c for c in candidates if c.strip()]
        if not candidates:  # an empty reply: its turn is the template text up to the first end-of-turn token
            found = [(at, -len(m)) for m in self.end_markers if (at := text.find(m, start)) >= 0]
            at, minus_length = min(found, default=(start, 0))
            return start, at - minus_length
        first = None
        for candidate in candidates:
            at = text.find(candidate, start)
            while at >= 0:
                end = at + len(candidate)
                closed = self._end_of_turn(text, end)
                if closed is not None or end == len(text):
                    return at, closed if closed is not None else end
                first = first or (at, end)
                at = text.find(candidate, at + 1)
        return first

    def _end_of_turn(self, text: str, end: int) -> int | None:
        """The end of the end-of-turn token(s) written at `end` (after whitespace: Llama-2 writes ' ' + eos)."""
        position = end
        while position < len(text) and text[position] in " \t\n":
            position += 1
        for marker in self.end_markers:
            if text.startswith(marker, position):
                return position + len(marker)
        return None

    def _render(self, messages: list[Message], add_generation_prompt: bool = False, strict: bool = True) -> str:
        """`apply_chat_template(messages, tokenize=False)`; a refusal is a DataError (or, not `strict`, jinja's)."""
        from jinja2 import TemplateError

        try:
            if self._compiled is not None:
                return str(self._compiled.render(messages=messages, tools=None, documents=None,
                                                 add_generation_prompt=add_generation_prompt, **self._variables))
            return str(self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                          add_generation_prompt=add_generation_prompt))
        except TemplateError as exc:
            if not strict:
                raise
            raise DataError(f"the chat template of {template_name(self.tokenizer)} refused the conversation: {exc}"
                            ) from None

    @property
    def _compiled(self) -> Any:
        """The template as transformers compiles it (its sandbox and globals), rendered directly: what
        apply_chat_template renders for messages of plain strings (ours: formats.py builds them), without its
        per-call copy of every message. None where this transformers has no such function (then the public way)."""
        if "compiled" not in self._cache:
            try:
                from transformers.utils.chat_template_utils import _compile_jinja_template

                self._cache["compiled"] = _compile_jinja_template(self.template)
            except ImportError:
                self._cache["compiled"] = None
        return self._cache["compiled"]

    @property
    def _variables(self) -> dict[str, Any]:
        if "variables" not in self._cache:  # what apply_chat_template passes: the special tokens by name
            self._cache["variables"] = dict(self.tokenizer.special_tokens_map)
        return self._cache["variables"]

    def _probe_end_markers(self) -> tuple[tuple[str, ...], str, str]:
        """What the template writes to close an assistant turn, read off a probe conversation: the run of special
        tokens after a reply, minus the next turn's header (e.g. <|im_end|>, <|eot_id|>, </s>; Cohere's
        <|END_RESPONSE|><|END_OF_TURN_TOKEN|>; GPT-OSS closes history with <|end|> and the last reply with
        <|return|>). These are what the model must learn to emit, and generation stops at them. Second: the
        final stop to append when the template closes a reply only by opening the next turn (GLM). Third: the
        token that closes the last reply (what generation must stop at)."""
        eos = self.tokenizer.eos_token or ""
        unreadable = ((eos,) if eos else (), "", eos)  # the EOS, no final stop
        try:
            text = self._render(_PROBE)
        except DataError:
            return unreadable
        specials = sorted(special_tokens(self.tokenizer), key=len, reverse=True)
        ask1, reply1, ask2, reply2 = (text.find(m["content"]) for m in _PROBE)
        if min(ask1, reply1, ask2, reply2) < 0:
            return unreadable
        between = text[reply1 + len(_PROBE[1]["content"]):ask2]
        header = common_suffix(between, text[:ask1])  # the next user turn's header, as the first one is written
        closing = special_run(between[:len(between) - len(header)], specials)
        next_role = "" if closing else special_run(between, specials, first_only=True)  # GLM: <|user|> stops
        last = special_run(text[reply2 + len(_PROBE[3]["content"]):], specials)
        markers = tuple(sorted({m for m in (closing or next_role, last) if m}, key=len, reverse=True))
        final_stop = next_role if next_role and not last else ""
        # A run of several tokens (Cohere's <|END_RESPONSE|><|END_OF_TURN_TOKEN|>) ends with the turn's own close.
        last_stop = last_special(last or closing, specials)
        return markers, final_stop, last_stop


def fold_system(messages: list[Message]) -> list[Message] | None:
    """The system prompt moved into the first user message, or None when there is nothing to fold."""
    if not messages or messages[0]["role"] != "system" or len(messages) < 2 or messages[1]["role"] != "user":
        return None
    first = {"role": "user", "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}
    return [first, *messages[2:]]

