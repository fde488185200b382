"""A trainer may write only the status of the FineTuneJob it was started for: its reports carry that job's UID as
a precondition, so the apiserver refuses a write to a job deleted and created again under the same name (the old
pod's last report used to land on the new job: step 2140, a loss and tokens/s it never trained)."""

import json
import ssl

from finetune_trainer.outputs.status_report import StatusReporter
from tests.builders import make_job
from tests.support.controlplane import ADMIN_TOKEN


def test_a_report_for_a_deleted_job_never_lands_on_the_new_one(kubectl, control_plane, namespace):
    doc = json.dumps(make_job({"metadata.name": "reborn", "metadata.namespace": namespace}))
    kubectl.run("apply", "-f", "-", input=doc)
    old_uid = kubectl.json("get", "ftj", "reborn", "-n", namespace)["metadata"]["uid"]
    context = ssl._create_unverified_context()  # the test apiserver's self-signed certificate
    reporter = StatusReporter(control_plane.server, ADMIN_TOKEN, namespace, "reborn", context, min_interval=0,
                              uid=old_uid)
    assert reporter.report({"progress": {"step": 10, "maxSteps": 100}})
    kubectl.run("delete", "ftj", "reborn", "-n", namespace, "--wait=true")
    kubectl.run("apply", "-f", "-", input=doc)  # the same name, a new job
    assert reporter.report({"progress": {"step": 2140, "maxSteps": 3000, "loss": 0.42}}) is False
    assert "progress" not in (kubectl.json("get", "ftj", "reborn", "-n", namespace).get("status") or {})
    assert reporter.refused_as_stale  # said once in the log, and no more retries against the wrong job
