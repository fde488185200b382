"""Runs against a real S3 server (MinIO, tests/support/minio.py): the tiny example pointed at a bucket, and
`finetune run` of it as a user starts it (tests/e2e/test_object_storage*.py; the bucket fixtures are in
tests/e2e/conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.controlplane import ROOT
from tests.support.trainer_run import TEST_ENV

ROWS = [{"instruction": q, "output": a} for q, a in [
    ("Name a primary colour.", "Red."), ("What is 2 + 2?", "4."), ("Translate 'hello' to French.", "Bonjour."),
    ("Give the opposite of 'hot'.", "Cold."), ("Spell 'cat' backwards.", "tac"), ("Sky colour?", "Blue.")]]


def put_tree(minio, local: Path, uri: str) -> None:
    fs = minio.filesystem()
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{uri}/{path.relative_to(local)}")


def job_doc(minio, bucket: str, **spec) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-cpu-sft.yaml").read_text())
    doc["metadata"]["name"] = "s3-job"
    doc["spec"]["model"]["name"] = f"{bucket}/models/tiny"
    doc["spec"]["data"]["train"] = [{"path": f"{bucket}/data/*.jsonl"}]
    doc["spec"]["output"] = {"uri": f"{bucket}/runs/s3-job"}
    doc["spec"]["s3"] = {"endpointURL": minio.url, "region": "us-east-1"}
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return doc


def finetune_run(doc: dict, workdir: Path, env: dict[str, str], *flags: str) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.yaml").write_text(yaml.safe_dump(doc))
    return subprocess.Popen([sys.executable, "-m", "finetune_operator", "run", str(workdir / "job.yaml"), "--output",
                             str(workdir / "run"), *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **TEST_ENV, **env, "HOME": str(workdir)})
