"""Fixtures of the end-to-end tests on object storage: a fresh MinIO bucket per test, with the tiny model and data in
it as a user keeps them."""

import hashlib
import json
import os

import pytest

from finetune_operator.api.storage import S3Spec
from finetune_trainer import objectstore
from tests.support.bucket_runs import ROWS, put_tree


@pytest.fixture
def store(minio, request):
    """A fresh bucket per test, the process's store pointed at MinIO with its credentials in the environment."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    name = "t-" + "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-") + digest
    bucket = minio.bucket(name)
    saved = {k: os.environ.get(k) for k in minio.env}
    os.environ.update(minio.env)
    objectstore.configure(S3Spec.model_validate({"endpointURL": minio.url, "region": "us-east-1"}))
    yield bucket
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture
def uploaded(minio, store, tiny_model_dir, tmp_path):
    """The tiny model and the data in the bucket, as a user keeps them."""
    put_tree(minio, tiny_model_dir, f"{store}/models/tiny")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        (data / f"part-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[i * 3:(i + 1) * 3]))
    put_tree(minio, data, f"{store}/data")
    return store
