"""What a chat template writes around a conversation's contents, read as text: the literal pieces between the
contents of one conversation shape (a Layout), and the runs of special tokens that open and close turns. Pure string
work on rendered templates; the encoder in chat.py decides what to learn from it."""

from dataclasses import dataclass
from typing import Any

Message = dict[str, str]


def placeholder(index: int) -> str:
    # Private-use characters: no template writes them and no content a placeholder stands for is compared to them.
    return f"\ue000{index}\ue001"


@dataclass(frozen=True)
class Layout:
    """What a template writes around the contents of one conversation shape: `segments[k]` is the literal text
    before the k-th content written (the last one follows the last content), and `learned` holds, per assistant
    message, its place among the written contents and how many characters before and after its content are
    learned (generation-prompt-to-reply text; end-of-turn tokens)."""

    segments: tuple[str, ...]
    learned: tuple[tuple[int, int, int], ...]
    # The messages whose contents the template writes, in the order it writes them (Mistral's templates write the
    # system prompt only into the last user turn, so a conversation that ends with a reply has none).
    written: tuple[int, ...]

    def spans(self, text: str, messages: list[Message]) -> list[tuple[int, int]] | None:
        """Character spans to learn in `text` (a render of `messages`), or None when the text is not this layout
        filled with the contents (the template changed the text around a content)."""
        contents = parse(text, self.segments, [messages[i]["content"] for i in self.written])
        if contents is None:
            return None
        return [(contents[i][0] - before, contents[i][1] + after) for i, before, after in self.learned]


def renderings(content: str) -> list[str]:
    """How a template may write a content: verbatim, or trimmed (Llama and Gemma templates trim)."""
    stripped = content.strip()
    return [content] if stripped == content else [content, stripped]


def parse(text: str, segments: tuple[str, ...], contents: list[str]) -> list[tuple[int, int]] | None:
    """Where each content lies when `text` is segments[0] + content 0 + segments[1] + ...: every piece is compared
    at its exact position (never searched for); a content written verbatim or trimmed. None when the text is not
    so made (the caller then locates replies per row)."""
    if len(segments) != len(contents) + 1 or not text.startswith(segments[0]):
        return None
    spans = []
    cursor = len(segments[0])
    for content, after in zip(contents, segments[1:], strict=True):
        for candidate in renderings(content):
            end = cursor + len(candidate)
            if text.startswith(candidate, cursor) and text.startswith(after, end):
                break
        else:
            return None
        spans.append((cursor, end))
        cursor = end + len(after)
    return spans if cursor == len(text) else None


def common_prefix_length(a: str, b: str) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def last_special(run: str, specials: list[str]) -> str:
    return next((s for s in specials if run.endswith(s)), "") if run else ""


def token_start(text: str, position: int, specials: set[str]) -> int:
    """`position`, moved back to the start of a special token of `text` that it would cut."""
    for token in specials:
        for start in range(max(0, position - len(token) + 1), position):
            if text.startswith(token, start):
                return token_start(text, start, specials)
    return position


def common_suffix_length(text: str, other: str, end: int) -> int:
    """How many characters text[:end] and `other` have in common at their ends."""
    n, limit = 0, min(end, len(other))
    while n < limit and text[end - 1 - n] == other[len(other) - 1 - n]:
        n += 1
    return n


def common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return a[len(a) - n:]


def special_run(text: str, specials: list[str], first_only: bool = False) -> str:
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


def special_tokens(tokenizer: Any) -> set[str]:
    tokens = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        tokens.add(str(getattr(added, "content", added)))
    return {t for t in tokens if t}
