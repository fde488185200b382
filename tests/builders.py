"""make_job(**overrides): a valid FineTuneJob manifest with dotted-path overrides, for table-driven tests."""

import copy
from typing import Any

from finetune_operator.api.constants import API_VERSION, KIND

_BASE: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "metadata": {"name": "test-job", "namespace": "default"},
    "spec": {
        "model": {"name": "/models/tiny-llama"},
        "data": {"format": "alpaca", "train": [{"path": "/data/train.jsonl"}]},
        "distributed": {"numNodes": 1, "gpusPerNode": 1},
    },
}

DELETE = object()


def make_job(overrides: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """Keys are dotted paths from the manifest root ("spec.distributed.numNodes"); value DELETE removes a key."""
    job = copy.deepcopy(_BASE)
    for path, value in {**(overrides or {}), **kw}.items():
        node = job
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return job
