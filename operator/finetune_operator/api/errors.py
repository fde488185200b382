"""FieldError: one problem in a FineTuneJob, with the path, the offending value, the rule and the fix."""

import re
import reprlib
from dataclasses import dataclass
from typing import Any

MAX_VALUE_CHARS = 80
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, MAX_VALUE_CHARS, MAX_VALUE_CHARS
# user:password@ in a URL: an error message (a status, an Event, a terminal) must not repeat a password.
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")


@dataclass(frozen=True)
class FieldError:
    """A single user-facing validation error; `path` uses the YAML names, e.g. spec.distributed.numNodes."""

    path: str
    value: Any
    message: str
    fix: str = ""

    def value_text(self) -> str:
        """The value as shown to a person: a 10,000-item list or a value nested 5,000 deep is shortened."""
        if self.value is None:
            return "unset"
        value = _URL_USERINFO.sub(r"\1***@", _SHORT.repr(self.value))
        if len(value) > MAX_VALUE_CHARS:
            value = f"{value[:MAX_VALUE_CHARS]}..."
        return value

    def render(self) -> str:
        text = f"{self.path}: {self.message} (got {self.value_text()})"
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
