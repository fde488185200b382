"""The trainer's progress report lands in the FineTuneJob status on a real apiserver and shows in kubectl get."""

import json
import ssl
import threading
import time
from types import SimpleNamespace

import pytest

from finetune_trainer.outputs.remote_output import RemoteOutput
from finetune_trainer.outputs.status_report import StatusReporter
from finetune_trainer.outputs.uploads import UploadState
from finetune_trainer.training.callbacks import CheckpointMarkerCallback, ProgressCallback
from tests.builders import make_job
from tests.support.controlplane import ADMIN_TOKEN


def test_progress_reaches_printer_columns(kubectl, control_plane, namespace):
    kubectl.run("apply", "-f", "-", input=json.dumps(make_job({"metadata.name": "reported",
                                                               "metadata.namespace": namespace})))
    context = ssl._create_unverified_context()  # the test apiserver's self-signed certificate
    reporter = StatusReporter(control_plane.server, ADMIN_TOKEN, namespace, "reported", context, min_interval=0)
    assert reporter.report({"progress": {"step": 50, "maxSteps": 200, "percent": 25, "loss": 0.75, "eta": "3m10s",
                                         "updatedAt": "2026-01-01T00:00:00Z"},
                            "checkpoint": {"step": 50, "path": "/output/checkpoint-50"}})
    row = kubectl.run("get", "ftj", "reported", "-n", namespace, "--no-headers").stdout.split()
    assert row[1:4] == ["25", "0.75", "3m10s"]  # phase, nodes and GPUs are blank until the operator writes them
    status = kubectl.json("get", "ftj", "reported", "-n", namespace)["status"]
    assert status["checkpoint"] == {"step": 50, "path": "/output/checkpoint-50"}
    # A status the schema refuses is reported as a failure, never raised into the training loop.
    assert reporter.report({"progress": {"step": -1}}) is False and reporter.failures == 1


class SlowFirstReport(StatusReporter):
    """A real reporter whose first patch is slow on the wire (a busy apiserver, a slow network)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent = 0

    def report(self, status, force=False):
        self.sent += 1
        if self.sent == 1:
            time.sleep(1.0)
        return super().report(status, force=force)


@pytest.mark.parametrize("completed_by", ["overlapped write", "upload"])
def test_a_checkpoint_completed_beside_the_loops_report_is_the_one_the_status_keeps(kubectl, control_plane, namespace,
                                                                                    tmp_path, completed_by):
    """The loop's on_save reports the checkpoint it knows (step 20) while another thread completes step 30 (the
    overlapped writer, or the upload to output.uri): the status must end on 30, whichever patch is slower."""
    name = f"raced-{completed_by.split()[0]}"
    reporter = a_job(kubectl, control_plane, namespace, name, min_interval=0, reporter_class=SlowFirstReport)
    progress = ProgressCallback(tmp_path, reporter)
    progress.checkpoint = {"step": 20, "path": str(tmp_path / "checkpoint-20")}
    progress.last_record = {"time": "2026-01-01T00:00:00Z", "step": 30, "maxSteps": 30, "loss": 0.5,
                            "learningRate": 1e-5, "tokensPerSecond": None, "eta": None}
    loop = threading.Thread(target=progress._report, args=(progress.last_record,), kwargs={"force": True})
    loop.start()
    deadline = time.monotonic() + 30
    while reporter.sent == 0 and time.monotonic() < deadline:  # the loop's report is on the wire
        time.sleep(0.01)
    if completed_by == "overlapped write":
        complete_overlapped(progress, tmp_path, 30)
    else:  # node 0's upload thread, through RemoteOutput's own report (built without a process group)
        remote = object.__new__(RemoteOutput)
        remote.uri, remote.is_main, remote.reporter, remote.progress = "s3://bucket/run", True, reporter, progress
        remote._report(lambda: {"uri": remote.uri, "pending": 0, "completeStep": 30})
    loop.join(timeout=30)
    assert not loop.is_alive()
    status = kubectl.json("get", "ftj", name, "-n", namespace)["status"]
    assert reporter.failures == 0 and status["checkpoint"]["step"] == 30 and status["progress"]["step"] == 30, status


def a_job(kubectl, control_plane, namespace, name, min_interval=10.0, reporter_class=StatusReporter):
    """A FineTuneJob `name`, and a real reporter to its status."""
    job = make_job({"metadata.name": name, "metadata.namespace": namespace})
    kubectl.run("apply", "-f", "-", input=json.dumps(job))
    context = ssl._create_unverified_context()  # the test apiserver's self-signed certificate
    return reporter_class(control_plane.server, ADMIN_TOKEN, namespace, name, context, min_interval=min_interval)


def complete_overlapped(progress, output_dir, step):
    """What the overlapped writer's thread does once checkpoint `step` is written: mark it, tell the status."""
    directory = output_dir / f"checkpoint-{step}"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"w" * 64)
    (directory / "trainer_state.json").write_text("{}")
    CheckpointMarkerCallback(output_dir, progress, {}, deferred=True).complete(step, directory, stall=0.01, save=0.2)


def log_step(progress, step, max_steps):
    state = SimpleNamespace(is_world_process_zero=True, global_step=step, max_steps=max_steps, epoch=step / max_steps,
                            num_input_tokens_seen=100 * step)
    progress.on_log(SimpleNamespace(world_size=1), state, None, logs={"loss": 1.0 / step, "learning_rate": 1e-5})
    return state


@pytest.mark.parametrize("ends_by", ["overlapped write", "train end"])
def test_a_run_whose_last_steps_came_within_the_report_interval_ends_on_its_last_step(kubectl, control_plane,
                                                                                       namespace, tmp_path, ends_by):
    """Steps faster than the reporter's 10 s interval: only the first one's record is sent as it comes. With the
    default saveSteps (500) a 30-step run saves only at its end, written by the overlapped writer after the loop's
    on_save (which knows no checkpoint yet); the writer's report, or the end of training, must leave step 30."""
    name = f"last-step-{ends_by.split()[0]}"
    reporter = a_job(kubectl, control_plane, namespace, name)
    progress = ProgressCallback(tmp_path, reporter)
    progress.started = progress.last_time = time.monotonic() - 1
    for step in (1, 10, 20, 30):
        state = log_step(progress, step, 30)
    progress.on_save(SimpleNamespace(), state, None)
    if ends_by == "overlapped write":
        complete_overlapped(progress, tmp_path, 30)
    else:
        progress.on_train_end(SimpleNamespace(), state, None)
    status = kubectl.json("get", "ftj", name, "-n", namespace)["status"]
    assert status["progress"]["step"] == 30 and status["progress"]["percent"] == 100, status
    assert ends_by != "overlapped write" or status["checkpoint"]["step"] == 30, status


class CountedReport(StatusReporter):
    """A real reporter that keeps what it sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.patches = []

    def report(self, status, force=False):
        sent = super().report(status, force=force)
        if sent:
            self.patches.append(status)
        return sent


def test_an_overlapped_save_patches_the_status_once(kubectl, control_plane, namespace, tmp_path):
    """The loop's on_save knows no newer checkpoint than the one already reported (the writer's thread reports the
    new one once written): it sends nothing; the writer's report carries the checkpoint and the last step."""
    name = "one-patch-a-save"
    reporter = a_job(kubectl, control_plane, namespace, name, reporter_class=CountedReport)
    progress = ProgressCallback(tmp_path, reporter)
    progress.started = progress.last_time = time.monotonic() - 1
    for save in (10, 20, 30):
        state = log_step(progress, save, 30)  # the reporter's 10 s interval: only the first step is sent
        before = len(reporter.patches)
        progress.on_save(SimpleNamespace(), state, None)
        complete_overlapped(progress, tmp_path, save)
        patches = reporter.patches[before:]
        assert [p["checkpoint"]["step"] for p in patches] == [save] and patches[0]["progress"]["step"] == save, patches
    status = kubectl.json("get", "ftj", name, "-n", namespace)["status"]
    assert status["checkpoint"]["step"] == 30 and status["progress"]["step"] == 30, status


def test_status_upload_says_nothing_is_behind_once_the_uploads_caught_up(kubectl, control_plane, namespace, tmp_path):
    """status.upload.behindSince is there while uploads are behind (`finetune` prints "uploads behind"): a merge
    patch keeps a key it leaves out, so the report after the store came back nulls it."""
    progress = ProgressCallback(tmp_path, a_job(kubectl, control_plane, namespace, "caught-up", min_interval=0))
    behind = UploadState(complete_step=10, pending=[20], behind_since=time.time(), last_error="store down", retries=3)
    progress.report_from_thread({"upload": behind.as_status("s3://b/run")})
    upload = kubectl.json("get", "ftj", "caught-up", "-n", namespace)["status"]["upload"]
    assert upload["behindSince"] and upload["lastError"] == "store down", upload
    progress.report_from_thread({"upload": UploadState(complete_step=20, pending=[], retries=3).as_status("s3://b/run")})
    upload = kubectl.json("get", "ftj", "caught-up", "-n", namespace)["status"]["upload"]
    assert upload["pending"] == 0 and upload["completeStep"] == 20, upload
    assert "behindSince" not in upload and "lastError" not in upload, upload


def test_a_loop_report_the_reporter_would_drop_does_not_wait_for_another_threads_patch(kubectl, control_plane,
                                                                                       namespace, tmp_path):
    """A report within the reporter's interval is dropped without a request: it must not wait behind a thread's
    patch on the wire (up to the reporter's 5 s timeout on a slow apiserver, each time the writer or the uploader
    reports)."""
    progress = ProgressCallback(tmp_path, a_job(kubectl, control_plane, namespace, "dropped"))
    progress.started = progress.last_time = time.monotonic() - 1
    log_step(progress, 1, 30)  # sent: the next on_log within 10 s is dropped
    progress._reporting.acquire()  # another thread's patch on the wire
    try:
        loop = threading.Thread(target=log_step, args=(progress, 2, 30), daemon=True)
        loop.start()
        loop.join(timeout=5)
        waited = loop.is_alive()
    finally:
        progress._reporting.release()
    loop.join(timeout=10)
    assert not waited, "the loop's dropped report waited for the lock"


@pytest.mark.parametrize("upload_first", [False, True])
def test_the_resume_report_says_where_the_attempt_resumed_from_even_after_a_newer_upload(
        kubectl, control_plane, namespace, tmp_path, upload_first):
    """An attempt resumes from checkpoint 20 while its upload thread catches up and reports checkpoint 30 first:
    status.checkpoint stays 30, and restoredFrom says 20's copy, not what an earlier attempt restored from."""
    name = f"restored-{'late' if upload_first else 'first'}"
    progress = ProgressCallback(tmp_path, a_job(kubectl, control_plane, namespace, name, min_interval=0))
    progress.report_from_thread({"checkpoint": {"step": 10, "path": "/output/checkpoint-10",
                                                "restoredFrom": "s3://b/run/checkpoint-10"}})  # attempt 1's
    newer = {"checkpoint": {"step": 30, "path": "/output/checkpoint-30"}}
    if upload_first:
        progress.report_from_thread(newer)
    progress.report_restored(20, "/output/checkpoint-20", "s3://b/run/checkpoint-20")
    if not upload_first:
        progress.report_from_thread(newer)
    checkpoint = kubectl.json("get", "ftj", name, "-n", namespace)["status"]["checkpoint"]
    assert checkpoint == {"step": 30, "path": "/output/checkpoint-30", "restoredFrom": "s3://b/run/checkpoint-20"}
    assert progress.checkpoint["step"] == 30
