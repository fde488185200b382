"""RFC 7386 JSON merge patch between two versions of the operator's status fields.

A merge patch keeps every key it does not mention, so sending the new status as it is would never remove a key
the new status no longer has (status.goodput.runningSince after a job stops running); the patch names it as null.
"""

from typing import Any


def merge_patch(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The smallest merge patch that turns `before` into `after` (lists are replaced whole, as RFC 7386 does)."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            nested = merge_patch(old, value)
            if nested:
                patch[key] = nested
        elif key not in before or value != old:
            patch[key] = value
    return patch
