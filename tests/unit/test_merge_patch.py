"""The status patch removes what the new status dropped, and mentions nothing that did not change."""

from finetune_operator.controller.merge_patch import merge_patch


def apply(doc, patch):
    """RFC 7386, as the apiserver applies it."""
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply(out[key], value)
        else:
            out[key] = value
    return out


def test_a_dropped_nested_key_is_nulled_and_unchanged_keys_are_not_sent():
    before = {"phase": "Running", "goodput": {"gpuHours": 1.0, "runningSince": "t0"}, "conditions": [{"a": 1}]}
    after = {"phase": "Succeeded", "goodput": {"gpuHours": 3.5}, "conditions": [{"a": 1}, {"b": 2}]}
    patch = merge_patch(before, after)
    assert patch == {"phase": "Succeeded", "goodput": {"gpuHours": 3.5, "runningSince": None},
                     "conditions": [{"a": 1}, {"b": 2}]}
    assert apply(before, patch) == after


def test_no_change_is_an_empty_patch_and_new_sections_are_sent_whole():
    status = {"phase": "Running", "goodput": {"gpuHours": 0.0}}
    assert merge_patch(status, status) == {}
    assert merge_patch({}, status) == status
