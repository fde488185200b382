"""FieldError: one problem in a FineTuneJob, with the path, the offending value, the rule and the fix."""

from dataclasses import dataclass
from typing import Any

MAX_VALUE_CHARS = 80


@dataclass(frozen=True)
class FieldError:
    """A single user-facing validation error; `path` uses the YAML names, e.g. spec.distributed.numNodes."""

    path: str
    value: Any
    message: str
    fix: str = ""

    def render(self) -> str:
        value = repr(self.value) if self.value is not None else "unset"
        if len(value) > MAX_VALUE_CHARS:  # a 10,000-item list must not become a 10,000-item message
            value = f"{value[:MAX_VALUE_CHARS]}... ({len(value)} characters)"
        text = f"{self.path}: {self.message} (got {value})"
        return f"{text}; fix: {self.fix}" if self.fix else text


class SpecRuleErrors(ValueError):
    """Raised from a model validator to carry several path-aware cross-field errors through pydantic at once."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(e.render() for e in errors))


class InvalidSpec(Exception):
    """Every error found in one FineTuneJob; permanent (retrying the same spec cannot help)."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__(self.summary())

    def summary(self) -> str:
        lines = [f"{len(self.errors)} error(s) in the FineTuneJob:"]
        lines += [f"  - {e.render()}" for e in self.errors]
        return "\n".join(lines)
