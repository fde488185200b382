"""Which `-m` expressions ask for the processes twins (tests/support/twins.py): refused without --twins, where the
twins are deselected and the run would be empty or short of them (tests/conftest.py)."""

import pytest

from tests.support.twins import asks_for_twins

OTHERS = ("unit", "cluster", "e2e", "images", "gpu")  # pyproject.toml's markers besides twin


def cases() -> list[tuple[str, bool]]:
    out = [("twin", True), ("(twin)", True), ("not twin", False), ("not  twin", False), ("not (twin)", False),
           ("not(twin)", False), ("", False), ("twin and", False)]  # the last is pytest's to refuse
    for m in OTHERS:
        out += [(f"twin and {m}", True), (f"{m} and twin", True), (f"twin and not {m}", True),
                (f"twin or {m}", True), (f"({m} or twin)", True),
                (m, False), (f"not {m}", False), (f"{m} and not twin", False), (f"not {m} and not twin", False),
                (f"not ({m} or twin)", False), (f"not({m} or twin)", False), (f"not ({m} and twin)", False)]
    return out


@pytest.mark.parametrize(("markexpr", "asks"), cases(), ids=[c[0] or "none" for c in cases()])
def test_an_expression_asks_for_the_twins_when_it_selects_them_for_being_twins(markexpr, asks):
    """`-m "not gpu"` (hack/test.sh) and `-m e2e` select twins as the e2e cases they are, which are deselected as
    ever; `-m "not (images or twin)"` leaves them out. Only an expression that holds for a twin because of its
    `twin` marker asks for them."""
    assert asks_for_twins(markexpr) is asks
