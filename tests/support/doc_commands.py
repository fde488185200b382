"""A documentation page's commands as written, and the output the page says they print.

A page's steps are its ```bash blocks, in order; a ```text block right after one (only blank lines or prose
between them, no other block) is what it prints. The tests run each block verbatim with bash and compare its
output with the page's, word by word: a line `...` stands for any number of lines, a word `...` for the rest of its
line, and values that differ from run to run match any value of their kind (decimals such as a loss, ages such as
2m10s, timestamps). Everything else must be equal, so a page whose commands or output drift fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
# Words whose value changes from run to run, by kind: a decimal, an age or duration, a date or time of day.
VOLATILE = {
    "decimal": re.compile(r"-?\d+\.\d+(e-?\d+)?%?"),
    "age": re.compile(r"(\d+d)?(\d+h)?(\d+m)?(\d+(\.\d+)?s)?"),
    "time": re.compile(r"\d{4}-\d{2}-\d{2}(T[\d:.]+Z?)?|\d{1,2}:\d{2}(:\d{2})?"),
}


@dataclass(frozen=True)
class Step:
    commands: str  # a bash block, exactly as the page has it (its indentation in a list removed)
    expected: str | None  # the text block after it: what the commands print
    line: int  # where the bash block starts in the page (1-based)


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, content, first line) of every fenced block, its list indentation removed."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang, start, body = len(m.group("indent")), m.group("lang"), i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        found.append((lang, "\n".join(body) + "\n", start))
        i += 1
    return found


def section(text: str, heading: str) -> tuple[str, int]:
    """The part of a page under `## heading` (up to the next heading of that level), and the number of lines
    before it."""
    lines = text.splitlines()
    start = lines.index(f"## {heading}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end]) + "\n", start


def steps(page: Path, heading: str | None = None) -> list[Step]:
    """The page's bash blocks in order (under `## heading` only, when given), each with the text block that
    follows it, if any."""
    text, offset = section(page.read_text(), heading) if heading else (page.read_text(), 0)
    found = [(lang, content, line + offset) for lang, content, line in blocks(text)]
    result = []
    for k, (lang, content, line) in enumerate(found):
        if lang != "bash":
            continue
        following = found[k + 1] if k + 1 < len(found) else None
        expected = following[1] if following is not None and following[0] == "text" else None
        result.append(Step(content, expected, line))
    return result


def _word_matches(expected: str, actual: str) -> bool:
    if expected == actual:
        return True
    (want, want_end), (got, got_end) = (_split_punctuation(expected), _split_punctuation(actual))
    return want_end == got_end and any(
        p.fullmatch(want) and p.fullmatch(got) for kind, p in VOLATILE.items()
        if kind != "age" or (want[-1:].isalpha() and got[-1:].isalpha()))


def _split_punctuation(word: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.*?)([,;:)\]]*)", word)
    assert m is not None
    return m.group(1), m.group(2)


def _line_matches(expected: str, actual: str) -> bool:
    want, got = expected.split(), actual.split()
    if want and want[-1] == "...":
        want, got = want[:-1], got[:len(want) - 1]
    return len(want) == len(got) and all(_word_matches(w, g) for w, g in zip(want, got, strict=True))


# Commands that only read what the cluster says: an Event or a status field may lag the condition a page's step
# waited for (the operator writes the status, then posts its Events), so their output is polled, not read once.
READS = re.compile(r"^kubectl (get|events|describe)\s[^;&|$`<>()]*$")


def only_reads(commands: str) -> bool:
    """Every line of the block is one kubectl read and nothing else (no second command chained to it)."""
    lines = [ln.strip() for ln in commands.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(READS.match(ln) for ln in lines)


def mismatch(expected: str, actual: str) -> str | None:
    """None when `actual` is what the page shows (the rules above); else what differs."""
    want = [line for line in expected.splitlines() if line.strip()]
    got = [line for line in actual.splitlines() if line.strip()]
    if _match(want, got):
        return None
    return "the page shows:\n" + "\n".join(want) + "\n\nthe commands printed:\n" + "\n".join(got)


def _match(want: list[str], got: list[str]) -> bool:
    if not want:
        return not got
    if want[0].strip() == "...":
        return any(_match(want[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and _line_matches(want[0], got[0]) and _match(want[1:], got[1:])
