"""The trainer's progress report lands in the FineTuneJob status on a real apiserver and shows in kubectl get."""

import json
import ssl

from finetune_trainer.outputs.status_report import StatusReporter
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
