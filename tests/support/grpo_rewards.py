"""Reward functions of the GRPO tests, as a user writes them (module:function, TRL's signature): imported by our
trainer from a module path, and by TRL's trainer called directly. Each scores text, so a tiny random model's
completions differ within a group (non-zero advantages: a loss and gradients worth comparing)."""

import math


def _text(completion):
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def letters(completions, **kwargs):
    """The share of a completion's characters that are lowercase letters or spaces: what the learning test
    teaches (a random model writes ~40% of them; plain English ~95%)."""
    out = []
    for completion in completions:
        text = _text(completion)
        out.append(sum(ch.islower() or ch == " " for ch in text) / len(text) if text else 0.0)
    return out


def vowel_e(completions, **kwargs):
    """1 for a completion with the letter e (a regex reward's reference implementation)."""
    return [1.0 if "e" in _text(c) else 0.0 for c in completions]


def answer_mentioned(completions, answer, **kwargs):
    """1 when the row's `answer` appears in the completion: a column passed as TRL passes columns."""
    return [1.0 if str(a).lower() in _text(c).lower() else 0.0 for c, a in zip(completions, answer, strict=True)]


# Broken on purpose, for the tests of the trainer's guard: each is named in its failure with the row.
def raises_on_cat(completions, prompts, **kwargs):
    for prompt in prompts:
        if "cat" in _text(prompt):
            raise ValueError("cats are not scored")
    return [0.0] * len(completions)


def wrong_length(completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def nan_on_fish(completions, prompts, **kwargs):
    return [math.nan if "fish" in _text(p) else 0.0 for p in prompts]


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)
