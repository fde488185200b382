"""Object storage (spec.s3, s3:// paths, output.uri) against a real S3 server: MinIO from its Go module, started on
127.0.0.1 by the tests. Data, model and output in buckets through `finetune run`; Ctrl-C, then a resume in an empty
directory from the bucket alone; refusals before training; the store going away while training runs."""

import json
import os
import signal

import pytest

from finetune_operator.api import exit_codes
from finetune_operator.api.storage import S3Spec
from finetune_operator.cli.processes import kill_tree
from finetune_trainer import errors, objectstore
from finetune_trainer.outputs import bucket, remote_output, uploads
from tests.support.bucket_runs import ROWS, finetune_run, job_doc, put_tree
from tests.support.polling import wait_for_run
from tests.support.trainer_run import trainer_loads


def test_a_run_stopped_with_ctrl_c_resumes_in_an_empty_directory_from_the_bucket_alone(minio, uploaded, tmp_path):
    doc = job_doc(minio, uploaded, training={"maxSteps": 400}, checkpoints={"saveSteps": 20, "keep": 2})
    first = finetune_run(doc, tmp_path / "laptop-1", minio.env)
    try:
        # Stopped once it has saved a checkpoint, long before its last step (a wait for the bucket's copy let a fast
        # run on a loaded machine reach step 400 first); the stop itself must reach the bucket before the exit.
        wait_for_run("a checkpoint", lambda: list((tmp_path / "laptop-1/run/output").glob("checkpoint-*")),
                     tmp_path / "laptop-1", alive=lambda: first.poll() is None,
                     tail=lambda: first.stdout.read() if first.poll() is not None else "")
        first.send_signal(signal.SIGINT)
        out, _ = first.communicate(timeout=300)
    finally:
        kill_tree(first.pid)
    assert first.returncode == exit_codes.INTERRUPTED, out
    stopped_at = bucket.newest_remote(f"{uploaded}/runs/s3-job")
    local_steps = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "laptop-1/run/output").glob("checkpoint-*"))
    assert stopped_at == max(local_steps)  # the checkpoint of the stop reached the bucket before the exit

    second = finetune_run(doc, tmp_path / "laptop-2", minio.env)  # nothing local: only the bucket
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out
    summary = json.loads((tmp_path / "laptop-2/run/logs/node-0.result.json").read_text())
    # Named as the user knows it: the bucket's object, not the download in this run's directory.
    assert summary["resumedFrom"] == f"{uploaded}/runs/s3-job/checkpoint-{stopped_at}" and summary["steps"] == 400
    fs = minio.filesystem()
    run = f"{uploaded}/runs/s3-job"
    assert fs.exists(f"{run}/final/adapter_model.safetensors") and fs.exists(f"{run}/summary.json")
    assert fs.exists(f"{run}/loss.png") and fs.exists(f"{run}/progress.jsonl")
    # The history goes on from the start, in the bucket and here (loss.png is drawn from it): steps 1..400, the
    # ones after the resumed checkpoint once (the first run's were dropped with it), none lost.
    for text in (fs.cat_file(f"{run}/progress.jsonl").decode(), (tmp_path / "laptop-2/run/output/progress.jsonl")
                 .read_text()):
        steps = [r["step"] for r in map(json.loads, text.splitlines()) if "step" in r]
        assert steps[0] == 1 and steps[-1] == 400 and steps == sorted(set(steps)), steps[:5]
        assert stopped_at in steps and stopped_at + 1 in steps
    complete = {s for s, done in bucket.remote_checkpoints(run).items() if done}
    assert complete == {380, 400}, complete  # checkpoints.keep: 2, in the bucket
    assert summary["uploaded"]["completeStep"] == 400 and summary["uploaded"]["uri"] == run
    # the model came from the bucket once, into the run's cache: only what a model needs
    staged = list((tmp_path / "laptop-2/run/output/.cache/models").iterdir())
    names = {p.name for d in staged for p in d.iterdir()}
    assert "model.safetensors" in names and "config.json" in names


@pytest.mark.parametrize("case", ["bad-credentials", "bad-session-token", "missing-bucket", "no-data", "missing-model",
                                  "tls-to-http"])
def test_refused_before_training_with_the_uri_and_the_reason(minio, uploaded, tmp_path, case):
    doc = job_doc(minio, uploaded)
    env = dict(minio.env)
    if case == "bad-credentials":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    elif case == "bad-session-token":  # right keys, a temporary credential's token that is not theirs
        env["AWS_SESSION_TOKEN"] = "not-a-session-token"
    elif case == "missing-bucket":
        doc["spec"]["output"]["uri"] = "s3://no-such-bucket/runs/x"
    elif case == "no-data":
        doc["spec"]["data"]["train"] = [{"path": f"{uploaded}/data/*.parquet"}]
    elif case == "missing-model":
        doc["spec"]["model"]["name"] = f"{uploaded}/models/nothing-here"
    else:  # MinIO speaks plain http
        doc["spec"]["s3"]["endpointURL"] = minio.url.replace("http://", "https://")
    proc = finetune_run(doc, tmp_path, env)
    out, _ = proc.communicate(timeout=300)
    expected = {"bad-credentials": (77, "StorageRefused", "refused the credentials"),
                "bad-session-token": (77, "StorageRefused", "refused the credentials (InvalidTokenId"),
                "tls-to-http": (77, "StorageRefused", "whose server speaks plain http (write http://"),
                "missing-bucket": (77, "StorageRefused", "the bucket no-such-bucket does not exist"),
                "no-data": (65, "DataError", f"no data file at {uploaded}/data/*.parquet"),
                "missing-model": (78, "InvalidConfig", "holds no model")}[case]
    assert proc.returncode == expected[0], out
    summary = json.loads((tmp_path / "run/logs/node-0.result.json").read_text())
    assert summary["reason"] == expected[1] and expected[2] in summary["message"], summary
    assert "not-the-secret" not in out and "finetune-test-secret-key" not in out  # never a key in a message
    if case == "bad-credentials":  # locally the credentials are the shell's, not a Secret's
        assert "the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of the shell" in summary["message"]
        assert "ServiceAccount" not in summary["message"]
    if case == "bad-session-token":  # the hint names the variable that is wrong
        assert "AWS_SESSION_TOKEN, which is set" in summary["message"], summary["message"]
        assert "not-a-session-token" not in out
    assert "may write" not in summary["message"] or case != "tls-to-http"
    assert not list((tmp_path / "run/output").glob("checkpoint-*"))  # refused before training


@pytest.mark.parametrize("case", ["bad-credentials", "missing-bucket"])
def test_a_refused_store_fails_before_torch_and_transformers_load(minio, uploaded, tmp_path, case):
    """The bucket and the prefix are checked before the trainer's heavy imports (~5 s of CPU a process)."""
    from finetune_operator.api.validation import validate_job
    from finetune_operator.cli.local_run import prepare

    doc = job_doc(minio, uploaded)
    env = dict(minio.env)
    if case == "bad-credentials":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    else:
        doc["spec"]["output"]["uri"] = "s3://no-such-bucket/runs/x"
    config, _ = prepare(validate_job(doc), tmp_path)
    code, loaded, out = trainer_loads(config, env)
    assert code == 77 and "StorageRefused" in out, out
    assert loaded == [], out


def test_a_two_node_run_refused_on_its_main_process_ends_on_every_node(minio, uploaded, tmp_path):
    """In a gang the bucket is checked once the process group exists: a refusal on rank 0 ends the other node's
    process at once, on its own. Checked before the group (as a process on its own does), the other node waited out
    its store's timeout to join a rank 0 that never came, until `finetune run` stopped it (55 s, not 13)."""
    doc = job_doc(minio, uploaded, distributed={"numNodes": 2})
    doc["spec"]["output"]["uri"] = "s3://no-such-bucket/runs/x"
    proc = finetune_run(doc, tmp_path, minio.env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 77 and "the bucket no-such-bucket does not exist" in out, out
    results = {p.name: json.loads(p.read_text()) for p in (tmp_path / "run/logs").glob("node-*.result.json")}
    assert results["node-0.result.json"]["reason"] == "StorageRefused", results
    assert results["node-1.result.json"]["reason"] != "Interrupted", results  # not left for the CLI to stop


def test_training_goes_on_while_the_store_is_down_and_uploads_catch_up(minio, uploaded, tmp_path):
    doc = job_doc(minio, uploaded, training={"maxSteps": 300}, checkpoints={"saveSteps": 25, "keep": 20})
    proc = finetune_run(doc, tmp_path, minio.env)
    progress = tmp_path / "run/output/progress.jsonl"
    try:
        wait_for_run("step 5", lambda: progress.exists() and any(json.loads(line).get("step", 0) >= 5
                                                                 for line in progress.read_text().splitlines()),
                     tmp_path, alive=lambda: proc.poll() is None)
        minio.stop()  # the store goes away while the run trains and saves
        wait_for_run("two uploads behind", lambda: any((json.loads(line).get("upload") or {}).get("pending", 0) >= 2
                                                       for line in progress.read_text().splitlines()),
                     tmp_path, alive=lambda: proc.poll() is None)
        minio.start(port=minio.port)  # back, with its data
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_tree(proc.pid)
        if minio.proc is None or minio.proc.poll() is not None:
            minio.start(port=minio.port)
    assert proc.returncode == 0, out
    assert "uploads behind:" in out  # said while the store was down (the client's own retries, or ours)
    summary = json.loads((tmp_path / "run/logs/node-0.result.json").read_text())
    assert "checkpointsNotUploaded" not in summary["uploaded"]
    complete = {s for s, done in bucket.remote_checkpoints(f"{uploaded}/runs/s3-job").items() if done}
    assert set(range(25, 301, 25)) <= complete
    assert minio.filesystem().exists(f"{uploaded}/runs/s3-job/final/adapter_model.safetensors")


def test_a_partial_upload_is_never_resumed(minio, store, tmp_path):
    """A gang killed mid-upload leaves checkpoint-20 without FINETUNE_COMPLETE: restore takes checkpoint-10."""
    run = f"{store}/runs/killed"
    for step, complete in ((10, True), (20, False)):
        local = tmp_path / "src" / f"checkpoint-{step}"
        local.mkdir(parents=True)
        (local / "model.safetensors").write_bytes(b"x" * 100)
        (local / "trainer_state.json").write_text("{}")
        if complete:
            (local / "FINETUNE_COMPLETE").write_text("{}")
        put_tree(minio, local, f"{run}/checkpoint-{step}")
    restored = bucket.restore(run, tmp_path / "output")
    assert restored == tmp_path / "output" / "checkpoint-10"
    assert not (tmp_path / "output" / "checkpoint-20").exists()


def test_checkpoints_an_earlier_run_left_behind_are_uploaded_by_the_next(minio, store, tmp_path):
    """A run that ended (exit 74) with checkpoints 20 and 30 still local: the next run on that directory uploads
    them, complete, instead of only its final model."""
    from finetune_trainer.outputs import checkpoints

    run, out = f"{store}/runs/behind", tmp_path / "output"
    for step in (10, 20, 30):
        local = out / f"checkpoint-{step}"
        local.mkdir(parents=True)
        (local / "model.safetensors").write_bytes(b"x" * 100)
        (local / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        checkpoints.mark_complete(local)
    put_tree(minio, out / "checkpoint-10", f"{run}/checkpoint-10")  # only the first reached the bucket
    remote = remote_output.RemoteOutput(run, out, nodes=1, keep=3, is_main=True)
    try:
        assert remote.catch_up() == ["checkpoint-20", "checkpoint-30"]
        assert remote.drain(120), remote.behind()
        assert {s for s, done in bucket.remote_checkpoints(run).items() if done} == {10, 20, 30}
        assert remote.catch_up() == []  # nothing owed any more
    finally:
        if remote.uploader is not None:
            remote.uploader.close()


def test_the_end_of_a_run_says_every_minute_what_it_waits_for_and_why(minio, store, tmp_path, monkeypatch):
    """The store down when training ends: finish() waits for the checkpoint uploads still owed, telling every
    minute which and why and how long it may still wait, then the final upload fails as 74 (UploadFailed)."""
    from finetune_trainer.outputs import checkpoints

    run, out = f"{store}/runs/down-at-the-end", tmp_path / "output"
    local = out / "checkpoint-10"
    local.mkdir(parents=True)
    (local / "model.safetensors").write_bytes(b"x" * 100)
    (local / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    checkpoints.mark_complete(local)
    (out / "loss.png").write_bytes(b"png")
    monkeypatch.setattr(remote_output, "FINISH_WAIT_SECONDS", 62.0)  # one minute's message, not ten
    monkeypatch.setattr(uploads, "FINAL_ATTEMPTS", 1)
    remote = remote_output.RemoteOutput(run, out, nodes=1, keep=3, is_main=True)
    said: list[str] = []
    minio.stop()
    try:
        remote.uploader.submit(local)
        with pytest.raises(errors.UploadFailed, match="loss.png is saved but its upload to .* failed"):
            remote.finish(["loss.png"], said.append)
    finally:
        minio.start(port=minio.port)
        remote.uploader.close()
    assert len(said) == 1 and said[0].startswith("still waiting for 1 checkpoint upload(s) to reach the bucket"), said
    assert "at most 0 more min" in said[0] or "at most 1 more min" in said[0], said


def test_errors_name_the_uri_and_never_the_key(minio, store):
    os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong-secret"
    objectstore.configure(S3Spec.model_validate({"endpointURL": minio.url}))
    with pytest.raises(errors.StorageRefused, match=rf"{store}/x: the store refused the credentials") as refused:
        objectstore.check_bucket(f"{store}/x")
    assert "wrong-secret" not in str(refused.value)


def test_every_file_type_a_prefix_a_glob_and_streaming_read_from_the_bucket(minio, store, tmp_path, tiny_tokenizer):
    import datasets

    from finetune_operator.api.data import DataSpec
    from finetune_trainer import data as D
    from finetune_trainer.data.streaming import prepare_streaming

    local = tmp_path / "files"
    local.mkdir()
    (local / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    datasets.Dataset.from_list(ROWS[3:]).to_parquet(str(local / "b.parquet"))
    datasets.Dataset.from_list(ROWS[:2]).to_csv(str(local / "c.csv"), index=False)
    (local / "notes" / "x.txt").parent.mkdir()
    (local / "notes" / "x.txt").write_text("The quick brown fox.\n\nThe lazy dog.\n" * 20)
    put_tree(minio, local, f"{store}/files")

    def rows(path: str, **spec) -> int:
        data = DataSpec.model_validate({"format": "alpaca", "train": [{"path": path}], **spec})
        return sum(len(part.rows) for part in D.load_rows(data.train, data))

    assert rows(f"{store}/files/*.jsonl") == 3
    assert rows(f"{store}/files/b.parquet") == 3
    assert rows(f"{store}/files/c.csv") == 2
    text = DataSpec.model_validate({"format": "text", "blockSize": 16, "train": [{"path": f"{store}/files/notes"}]})
    _, stats = D.tokenize(D.load_rows(text.train, text), text, tiny_tokenizer)
    assert stats.rows == 1 and stats.kept > 5  # the prefix's one .txt file, one document
    streamed = DataSpec.model_validate({"format": "alpaca", "streaming": True, "train": [
        {"path": f"{store}/files/*.jsonl"}]})
    prepared = prepare_streaming(streamed, tiny_tokenizer, seed=0)
    assert len(list(prepared.train)) == 3

