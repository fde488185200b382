"""docs/reference/events.md and labels.md hold what the code writes: every reason the operator or the trainer gives
is described, every described reason is still given, and every label or annotation we set is listed with where."""

import ast
import re
from pathlib import Path

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api import exit_codes
from finetune_operator.api.status import ConditionType, Phase
from finetune_operator.controller.reasons import KUBERNETES_WORDS, REASONS, TRAINER_NOTICES
from finetune_operator.reference_pages import COPIED_FROM_THE_JOB, SET_AT_RUN_TIME, _constants, rendered_keys
from tests.conftest import ROOT

pytestmark = pytest.mark.unit
CONTROLLER = sorted((ROOT / "operator" / "finetune_operator" / "controller").glob("*.py"))
TRAINER = sorted((ROOT / "trainer_image" / "finetune_trainer").rglob("*.py"))
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z][A-Z][a-z]+[A-Z][A-Za-z]*")
NAMES = set(Phase.__args__) | set(ConditionType.__args__)  # type: ignore[attr-defined]
EXIT_REASONS = set(exit_codes.REASONS.values()) | {"Error"}


def _strings(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def _trainer_reasons(path: Path) -> set[str]:
    """The reasons a trainer module gives: warn("X", ...) or warnings("X", ...) (main's Warnings, called by the
    name it has there) and a TrainerError's `reason = "X"`."""
    found = set()
    for n in ast.walk(ast.parse(path.read_text())):
        name = getattr(n.func, "id", None) or getattr(n.func, "attr", None) if isinstance(n, ast.Call) else None
        if name in ("warn", "warnings") and n.args and isinstance(n.args[0], ast.Constant):
            found.add(n.args[0].value)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "reason" for t in n.targets):
            values = [n.value.body, n.value.orelse] if isinstance(n.value, ast.IfExp) else [n.value]
            found |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


def test_every_camelcase_word_of_the_operator_is_a_described_reason_or_one_it_reads():
    """A new reason in the controller's code without a line in controller/reasons.py fails here."""
    words = {s for path in CONTROLLER if path.name != "reasons.py" for s in _strings(path) if CAMEL.fullmatch(s)}
    known = set(REASONS) | KUBERNETES_WORDS | NAMES | EXIT_REASONS | set(TRAINER_NOTICES)
    assert sorted(words - known) == []


def test_the_operators_lists_of_reasons_are_described():
    """The reasons the operator declares (why a gang waits, why it restarts, what Kueue never admits), wherever
    their words are written (api/ too)."""
    from finetune_operator.controller.metrics import RESTART_REASONS
    from finetune_operator.controller.observed import WAITING_REASONS
    from finetune_operator.controller.queueing import NEVER_ADMITTED

    declared = {*WAITING_REASONS, *RESTART_REASONS, *NEVER_ADMITTED}
    assert sorted(declared - set(REASONS) - EXIT_REASONS) == []


def test_every_reason_the_trainer_gives_is_described():
    given = {r for path in TRAINER for r in _trainer_reasons(path)}
    assert sorted(given - set(TRAINER_NOTICES) - set(REASONS) - EXIT_REASONS) == []
    assert sorted(set(TRAINER_NOTICES) - given) == []  # and none described that nothing gives


def test_every_described_reason_is_still_given_by_the_code():
    operator = [p for p in (ROOT / "operator" / "finetune_operator").rglob("*.py")
                if p.name not in ("reasons.py", "reference_pages.py")]
    code = set().union(*map(_strings, operator), *map(_strings, TRAINER))
    assert sorted(set(REASONS) - code) == []
    assert not KUBERNETES_WORDS & set(REASONS)


def test_every_label_and_annotation_we_set_is_listed_with_the_objects_that_carry_it():
    constants, seen = _constants(), rendered_keys()
    ours = {k for k in seen if k.startswith((c.GROUP, "app.kubernetes.io/"))}
    assert sorted(ours - set(constants)) == []  # a key rendered without a named constant
    not_rendered = {**SET_AT_RUN_TIME, **COPIED_FROM_THE_JOB}
    unlisted = [k for k in constants if k not in seen and k not in not_rendered]
    assert unlisted == []  # a constant neither rendered nor said to be set while a job runs (or copied)
    operator = sorted((ROOT / "operator" / "finetune_operator").rglob("*.py"))
    for key in not_rendered:  # ... and those are used by the code that sets, copies or reads them
        name = constants[key][0]
        assert any(f"c.{name}" in p.read_text() for p in operator + TRAINER), name
    assert all(comment for _, comment in constants.values())


def test_the_status_page_describes_every_field():
    page = (ROOT / "docs" / "reference" / "status.md").read_text()
    rows = re.findall(r"^\| `(status\.[^`]+)` \|.*\| (.*) \|$", page, re.M)
    assert len(rows) > 80 and all(description.strip() for _, description in rows)
