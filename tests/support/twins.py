"""The processes twins of the e2e cases that run with our images as containers (tests/conftest.py deselects them
unless --twins), and whether a `-m` expression asks for them."""

import itertools
import re

import pytest

# pytest's own grammar for a marker expression's identifiers (_pytest/mark/expression.py), less its keywords.
IDENT = re.compile(r"(?:\w|:|\+|-|\.|\[|\]|\\|/)+")
KEYWORDS = {"and", "or", "not"}


def mark_twins(items: list[pytest.Item]) -> list[pytest.Item]:
    """An e2e case run with its pods as local processes (runtime "processes") that is also collected with our images
    as containers, its other parameters the same, is that case's twin: marked `twin` and returned. Only the
    containers one runs, the real thing; `--twins` runs the twins as well (`--twins -m twin`: the twins alone, which
    run this checkout's code, no image rebuilt after an edit). Found among the items collected: the twin of a file
    collected alone runs."""

    def key(item: pytest.Item, runtime: str) -> tuple | None:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("runtime") != runtime:
            return None
        return getattr(item, "originalname", item.name), tuple(sorted(
            (k, repr(v)) for k, v in params.items() if k != "runtime"))

    in_containers = {key(item, "containers") for item in items} - {None}
    twins = [item for item in items if key(item, "processes") in in_containers]
    for item in twins:
        item.add_marker(pytest.mark.twin)
    return twins


def asks_for_twins(markexpr: str) -> bool:
    """Whether `-m markexpr` selects tests for being twins: for some set of the other markers it names, it holds
    with `twin` and not without (`twin`, `twin and not gpu`, `e2e and twin`). Not `not twin`, `not (images or
    twin)`, nor `e2e` or `not gpu`, which a twin meets as the e2e case it is (deselected then, as without -m).
    Evaluated by pytest's own expression; a malformed one is pytest's to refuse."""
    from _pytest.mark.expression import Expression

    try:
        expression = Expression.compile(markexpr)
    except SyntaxError:
        return False
    def selects(marks: set[str]) -> bool:
        return expression.evaluate(lambda name, /, **_: name in marks)

    others = sorted(set(IDENT.findall(markexpr)) - KEYWORDS - {"twin"})
    for present in itertools.product((False, True), repeat=len(others)):
        marks = {name for name, on in zip(others, present, strict=True) if on}
        if selects(marks | {"twin"}) and not selects(marks):
            return True
    return False
