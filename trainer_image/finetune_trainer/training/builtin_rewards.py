"""The built-in rewards of method.grpo.rewards, as TRL reward functions: f(prompts, completions, completion_ids,
**columns) -> one float (or None: not applicable to this row) per completion.

TRL's own rewards are used where they run: its think format reward, its soft overlong punishment (the length
penalty) and, when the image has math-verify, its accuracy reward. Without math-verify (not in the trainer image:
TRL makes it optional), `accuracy` compares the completion's final answer with the reference here: the last
\\boxed{...} of the completion, else its last number, equal to the reference as a number (integers, decimals,
fractions, \\frac{a}{b}, a thousands separator) or, failing that, as normalised text. It does not prove two
expressions equal (x+1 against 1+x, sqrt(2)/2 against 1/sqrt(2)): math-verify does."""

import importlib.util
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from finetune_operator.api.grpo import DEFAULT_COLUMNS, RewardSpec

RewardFunc = Callable[..., list[float | None]]
THINK_ANSWER = re.compile(r"^\s*<think>(?:(?!<think>).)*?</think>\s*<answer>(?:(?!<answer>).)*?</answer>\s*$",
                          re.DOTALL)
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+]?\.\d+")
FRAC = re.compile(r"\\d?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")


def text_of(completion: Any) -> str:
    """A completion as text: TRL gives text for text prompts, [{"role": "assistant", "content": ...}] for
    conversations."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def as_number(text: str) -> Fraction | None:
    """A number written as an integer, a decimal, a/b or \\frac{a}{b} (with $, spaces and a trailing period
    around it), or None."""
    text = text.strip().strip("$").strip().rstrip(".").strip()
    text = FRAC.sub(lambda m: f"({m.group(1)})/({m.group(2)})", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("(", "").replace(")", "").replace(" ", "")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    try:
        if "/" in text:
            top, bottom = text.split("/", 1)
            return Fraction(top) / Fraction(bottom)
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def final_answer(text: str) -> str | None:
    """What a completion answers: its last \\boxed{...}, else its last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _plain(text: str) -> str:
    return re.sub(r"\s+", "", text.strip().strip("$").rstrip(".")).replace("\\left", "").replace("\\right", "")


def same_answer(answer: str, reference: str) -> bool:
    """Equal as numbers when both read as one, else as text without spaces, $ and a trailing period."""
    a, b = as_number(answer), as_number(reference)
    if a is not None and b is not None:
        return a == b
    return _plain(answer) == _plain(reference)


def math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def accuracy(column: str) -> RewardFunc:
    """TRL's accuracy reward (math-verify) when installed, else final_answer against the reference."""
    if math_verify_available():
        from trl.rewards import accuracy_reward

        def with_math_verify(completions, **kwargs):
            # TRL's reads completion[0]["content"] and the reference from `solution`.
            messages = [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]
            return accuracy_reward(messages, [str(s) for s in kwargs[column]])

        return with_math_verify

    def without_math_verify(completions, **kwargs):
        out: list[float | None] = []
        for completion, reference in zip(completions, kwargs[column], strict=True):
            gold = str(reference).strip()
            gold = last_boxed(gold) or gold
            if not gold:
                out.append(None)  # as TRL's: no reference, the row is skipped
                continue
            answer = final_answer(text_of(completion))
            out.append(1.0 if answer is not None and same_answer(answer, gold) else 0.0)
        return out

    return without_math_verify


def exact_match(column: str, extract: str | None, case_sensitive: bool) -> RewardFunc:
    pattern = re.compile(extract, re.DOTALL) if extract else None

    def reward(completions, **kwargs):
        out: list[float | None] = []
        for completion, reference in zip(completions, kwargs[column], strict=True):
            text = text_of(completion)
            if pattern is not None:
                match = pattern.search(text)
                if match is None:
                    out.append(0.0)
                    continue
                text = match.group(1) or ""
            answer, gold = text.strip(), str(reference).strip()
            if not case_sensitive:
                answer, gold = answer.casefold(), gold.casefold()
            out.append(1.0 if answer == gold else 0.0)
        return out

    return reward


def regex(pattern: str | None, column: str | None) -> RewardFunc:
    fixed = re.compile(pattern) if pattern is not None else None
    cache: dict[str, re.Pattern[str]] = {}

    def reward(completions, **kwargs):
        patterns = [fixed] * len(completions) if fixed is not None else [
            cache.setdefault(str(p), re.compile(str(p))) for p in kwargs[column]]
        return [1.0 if p.search(text_of(c)) else 0.0 for p, c in zip(patterns, completions, strict=True)]

    return reward


def think_answer(completions, **kwargs) -> list[float]:
    """<think>...</think> then <answer>...</answer>, and nothing else (1), or not (0)."""
    return [1.0 if THINK_ANSWER.match(text_of(c)) else 0.0 for c in completions]


def think(completions, **kwargs) -> list[float]:
    """TRL's think format reward: one <think>...</think> block first."""
    from trl.rewards import think_format_reward

    return think_format_reward([[{"content": text_of(c)}] for c in completions])


def builtin(reward: RewardSpec, max_completion_length: int) -> RewardFunc:
    """The function of a built-in reward type."""
    column = reward.column or DEFAULT_COLUMNS.get(reward.type)
    if reward.type == "accuracy":
        return accuracy(column or "solution")
    if reward.type == "exactMatch":
        return exact_match(column or "answer", reward.extract, reward.case_sensitive)
    if reward.type == "regex":
        return regex(reward.pattern, reward.column)
    if reward.type == "format":
        return think if reward.format == "think" else think_answer
    if reward.type == "length":
        from trl.rewards import get_soft_overlong_punishment

        limit = reward.max_tokens or max_completion_length
        soft = reward.soft_tokens if reward.soft_tokens is not None else limit // 4
        return _overlong(get_soft_overlong_punishment(limit, soft), soft)
    raise ValueError(f"{reward.type} is not a built-in reward")


def _overlong(punish: Any, soft: int) -> RewardFunc:
    """TRL's soft overlong punishment divides by its soft window: with none (0), only past the limit counts."""
    if soft > 0:
        return punish

    def hard(completion_ids, **kwargs):
        return [-1.0 if len(ids) > punish.max_completion_len else 0.0 for ids in completion_ids]

    return hard
