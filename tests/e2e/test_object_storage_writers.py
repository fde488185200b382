"""output.uri with more than one writer, against the real MinIO of test_object_storage.py: several nodes that share
a run directory, a second run on the same prefix (refused, or taking it over when asked), uploads that fall behind
during an outage (checkpoints.keep), errors that are not outages (given up, not retried forever), and a stop while a
finished run waits for its uploads (issue 42, 5)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from finetune_operator.api import exit_codes
from finetune_operator.cli.processes import kill_tree
from finetune_trainer.errors import ConfigError
from finetune_trainer.outputs import bucket, checkpoints, owner, uploads
from finetune_trainer.outputs.uploads import CheckpointUploader, NodeLayout
from tests.support.bucket_runs import finetune_run, job_doc
from tests.support.polling import wait_for_run


def local_checkpoint(out: Path, step: int) -> Path:
    directory = out / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"x" * 100)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    checkpoints.mark_complete(directory)
    return directory


def owner_record(minio, run: str) -> dict:
    return json.loads(minio.filesystem().cat_file(f"{run}/{owner.OWNER_FILE}"))


class Lines:
    """A process's output, read as it comes (so a test can wait for a line and still get the whole output)."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        self.thread.start()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines[-40:])
            time.sleep(0.2)

    def rest(self, timeout: float) -> str:
        self.proc.wait(timeout=timeout)
        self.thread.join(timeout=10)
        return "".join(self.lines)


def test_two_nodes_sharing_a_run_directory_upload_complete_checkpoints_and_leave_nothing_partial(minio, uploaded,
                                                                                                  tmp_path):
    """`finetune run` of 2 nodes on one machine (the nodes share the run directory, as on a ReadWriteMany claim):
    each node stages under a name of its own, only node 0 uploads what the shared directory holds, every kept
    checkpoint is complete in the bucket with both processes' files, and nothing partial or staged is left."""
    doc = job_doc(minio, uploaded, training={"maxSteps": 40}, checkpoints={"saveSteps": 10, "keep": 2},
                  distributed={"numNodes": 2})
    proc = finetune_run(doc, tmp_path, minio.env)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == 0, out
    run = f"{uploaded}/runs/s3-job"
    assert bucket.remote_checkpoints(run) == {30: True, 40: True}, out  # keep 2; nothing partial
    names = {p.rsplit("/", 1)[-1] for p in minio.filesystem().find(f"{run}/checkpoint-40")}
    assert {"trainer_state.json", "adapter_model.safetensors", "rng_state_0.pth", "rng_state_1.pth"} <= names, names
    summary = json.loads((tmp_path / "run/logs/node-0.result.json").read_text())
    assert summary["uploaded"]["completeStep"] == 40 and "checkpointUploadFailures" not in summary["uploaded"]
    assert summary["uploaded"]["checkpointUploadRetries"] == 0, summary["uploaded"]
    staged = tmp_path / "run/output" / uploads.SNAPSHOTS
    assert not [p for p in staged.rglob("*") if p.is_file()]
    assert "still waiting for" not in out  # no wait at the end: every upload was done
    record = owner_record(minio, run)
    assert record["released"] is True and str(tmp_path / "run" / "output") in record["writer"]


def test_a_second_run_on_the_prefix_is_refused_while_the_first_writes_and_takes_it_over_only_when_asked(
        minio, uploaded, tmp_path):
    """Two `finetune run`s with other --output but one output.uri: the second is refused before training, naming
    the first and the ways out; a third with --take-over takes the prefix, and the first stops at its next
    checkpoint (exit 78, saying who took over) instead of writing beside it; the third's stop releases the lease."""
    doc = job_doc(minio, uploaded, training={"maxSteps": 100000}, checkpoints={"saveSteps": 20, "keep": 2})
    run = f"{uploaded}/runs/s3-job"
    first = finetune_run(doc, tmp_path / "first", minio.env)
    procs = [first]
    try:
        wait_for_run("a checkpoint in the bucket", lambda: bucket.newest_remote(run) is not None, tmp_path / "first",
                     alive=lambda: first.poll() is None,
                     tail=lambda: first.stdout.read() if first.poll() is not None else "")
        second = finetune_run(doc, tmp_path / "second", minio.env)
        procs.append(second)
        out, _ = second.communicate(timeout=300)
        assert second.returncode == exit_codes.CONFIG_ERROR, out
        message = json.loads((tmp_path / "second/run/logs/node-0.result.json").read_text())["message"]
        assert f"spec.output.uri {run} is being written by finetune run of s3-job on" in message, message
        assert str(tmp_path / "first/run/output") in message and "`finetune run --take-over`" in message
        assert not list((tmp_path / "second/run/output").glob("checkpoint-*"))  # refused before training

        third = finetune_run(doc, tmp_path / "third", minio.env, "--take-over")
        procs.append(third)
        third_out = Lines(third)
        third_out.wait_for("taken over on request (--take-over)", 300)
        assert str(tmp_path / "third/run/output") in owner_record(minio, run)["writer"]
        out, _ = first.communicate(timeout=300)  # stops at its next save
        assert first.returncode == exit_codes.CONFIG_ERROR, out
        assert f"{run} was taken over by finetune run of s3-job on" in out and str(tmp_path / "third") in out, out
        third.send_signal(signal.SIGINT)
        rest = third_out.rest(300)
        assert third.returncode == exit_codes.INTERRUPTED, rest
    finally:
        for proc in procs:
            kill_tree(proc.pid)
    record = owner_record(minio, run)
    assert record["released"] is True and str(tmp_path / "third/run/output") in record["writer"]


def test_a_lease_not_renewed_is_taken_over_and_a_released_one_is_free(minio, store, monkeypatch):
    run = f"{store}/runs/lease"
    a = owner.OwnerRecord(run, owner.Writer("a", "run A"))
    b = owner.OwnerRecord(run, owner.Writer("b", "run B"))
    try:
        assert a.claim() is None
        with pytest.raises(ConfigError, match=r"is being written by run A \(since .*, lease renewed \d+ s ago\)"):
            b.claim()
        with pytest.raises(ConfigError, match="is being written by run A"):
            b.check()  # the preflight's judgement, before any GPU is asked for
        a.check()
        assert a.claim() is None  # the same writer again (a gang restart, a rerun on the same --output)
        monkeypatch.setattr(owner, "LEASE_SECONDS", -1.0)  # as if A had missed its renewals for long
        assert "was held by run A, which stopped renewing its lease" in (b.claim() or "")
        with pytest.raises(owner.OwnershipLost, match="was taken over by run B"):
            a.verify()
        b.release()
        assert owner_record(minio, run)["released"] is True
        monkeypatch.setattr(owner, "LEASE_SECONDS", 300.0)
        c = owner.OwnerRecord(run, owner.Writer("c", "run C"))
        assert c.claim() is None  # a released lease is free at once
        c.release()
    finally:
        a.release()
        b.release()


# A claim that a stop signal interrupts right after the record's write, in a process of its own (the trainer's
# handler: SIGTERM raises StopRequested).
STOPPED_CLAIM = """
import os, signal, sys
from finetune_operator.api.storage import S3Spec
from finetune_trainer import objectstore
from finetune_trainer.errors import StopRequested
from finetune_trainer.outputs import owner

objectstore.configure(S3Spec.model_validate({"endpointURL": sys.argv[1], "region": "us-east-1"}))
signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(StopRequested("stopped")))
record = owner.OwnerRecord(sys.argv[2], owner.Writer("a", "run A"))
write = record._write


def write_then_stop(*args, **kwargs):
    write(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)


record._write = write_then_stop
record.claim()
"""


def test_a_stop_that_lands_just_after_the_lease_is_written_still_releases_it(minio, store):
    """The record is this run's from its write on: a stop that lands before claim() returns ends the process
    through its exit handlers, which release the record, so the next run is not refused for the lease's 5 min."""
    run = f"{store}/runs/stopped-claim"
    proc = subprocess.run([sys.executable, "-c", STOPPED_CLAIM, minio.url, run], env={**os.environ, **minio.env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "StopRequested: stopped" in proc.stderr, proc.stderr
    record = owner_record(minio, run)
    assert record["owner"] == "a" and record["released"] is True, record


def test_while_the_store_is_down_only_keep_checkpoints_wait_and_leftovers_of_an_earlier_run_go(minio, store,
                                                                                                 tmp_path):
    """An outage: every new checkpoint is staged, but only the newest checkpoints.keep stay (older ones would be
    rotated out of the bucket at once); what an earlier process left in .uploading is cleared at start; once the
    store is back the kept ones are complete in the bucket."""
    run, out = f"{store}/runs/outage", tmp_path / "output"
    leftovers = [out / uploads.SNAPSHOTS / "checkpoint-5", out / uploads.SNAPSHOTS / "node-0" / "checkpoint-7"]
    for directory in leftovers:
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"old")
    saved = [local_checkpoint(out, step) for step in range(10, 70, 10)]
    minio.stop()
    try:
        uploader = CheckpointUploader(run, out, NodeLayout(0, 1, token="t"), keep=2)
        assert not any(d.exists() for d in leftovers)
        for directory in saved:
            uploader.submit(directory)
        staging = out / uploads.SNAPSHOTS / "node-0"
        deadline = time.monotonic() + 120
        while sorted(p.name for p in staging.iterdir()) != ["checkpoint-50", "checkpoint-60"]:
            assert time.monotonic() < deadline, sorted(p.name for p in staging.iterdir())
            time.sleep(0.2)
        assert sorted(uploader.state.pending) == [50, 60]
    finally:
        minio.start(port=minio.port)
    try:
        assert uploader.wait(180), uploader.state
        assert bucket.remote_checkpoints(run) == {50: True, 60: True}
        assert sorted(uploader.state.skipped) == [10, 20, 30, 40] and not uploader.failures
        assert not list(staging.iterdir())
    finally:
        uploader.close()


def test_an_upload_error_that_is_not_an_outage_is_given_up_not_retried_forever(minio, store, tmp_path):
    """A bucket deleted under the run (NoSuchBucket, a local file gone: not an outage): a few tries, then the
    checkpoint is given up and said, and the uploader is idle again (the end of the run does not wait 10 minutes)."""
    out = tmp_path / "output"
    uploader = CheckpointUploader("s3://no-such-bucket-42/runs/x", out, NodeLayout(0, 1, token="t"), keep=2)
    try:
        uploader.submit(local_checkpoint(out, 10))
        assert uploader.wait(120), uploader.state
    finally:
        uploader.close()
    assert uploader.state.retries == uploads.OTHER_ERROR_ATTEMPTS - 1
    assert len(uploader.failures) == 1 and "checkpoint-10" in uploader.failures[0], uploader.failures
    assert "no-such-bucket-42" in uploader.failures[0]


def test_ctrl_c_while_a_finished_run_waits_for_its_uploads_says_what_happened(minio, uploaded, tmp_path):
    """The store down when training ends: the run waits for its checkpoint uploads; a Ctrl-C then ends the wait at
    once (exit 143), saying that training had finished and the model is saved here, not uploaded (not "before
    training started")."""
    doc = job_doc(minio, uploaded, training={"maxSteps": 60}, checkpoints={"saveSteps": 20, "keep": 2})
    proc = finetune_run(doc, tmp_path, minio.env)
    lines = Lines(proc)
    try:
        lines.wait_for("[#", 300)  # training runs
        minio.stop()
        lines.wait_for("training is done; waiting up to 10 min", 300)
        proc.send_signal(signal.SIGINT)
        out = lines.rest(120)
    finally:
        kill_tree(proc.pid)
        minio.start(port=minio.port)
    assert proc.returncode == exit_codes.INTERRUPTED, out
    assert "stopped by Ctrl-C in finetune run (or a SIGTERM sent to it) after training had finished" in out, out
    assert "the final model is saved in" in out and "before training started" not in out
    assert (tmp_path / "run/output/final/adapter_model.safetensors").exists()
