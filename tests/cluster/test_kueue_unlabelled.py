"""Kueue with manageJobsWithoutQueueName: true manages Jobs that carry no queue name too (its webhook suspends them
at creation). The operator must see that Kueue owns the Job's spec.suspend without any label of ours: the job reads
Queued with Kueue's reason, never Resuming, and the Job is not flipped back and forth."""

import json

import pytest

from finetune_operator.api import constants as c
from tests.cluster.test_kueue import finish, gang, job_of, suspend_flips
from tests.cluster.test_operator import status, wait_for, wait_phase
from tests.support.kueue import Kueue, cluster_queue, local_queue, wait_quota_free
from tests.support.minio import build_components


@pytest.fixture(scope="module")
def kueue(kubectl, control_plane):
    manager = Kueue(build_components()["kueue"], control_plane, kubectl, manage_jobs_without_queue_name=True).start()
    for obj in cluster_queue("gpus", 16):
        kubectl.run("apply", "-f", "-", input=json.dumps(obj))
    yield manager
    manager.stop()


def test_a_job_without_a_queue_name_that_kueue_manages_is_queued_not_fought_over(kueue, kubectl, operator,
                                                                                   namespace):
    gang(kubectl, namespace, "unlabelled", queue=None)
    st = wait_for(lambda: (s := status(kubectl, namespace, "unlabelled") or {}).get("phase") == "Queued" and s, 60,
                  "Queued", operator)
    job = job_of(kubectl, namespace, "unlabelled")
    assert job["spec"]["suspend"] is True and c.LABEL_KUEUE_QUEUE not in job["metadata"]["labels"]
    assert suspend_flips(kubectl, namespace, "unlabelled", 15) == 0  # was 52 Job updates in 42 s
    assert status(kubectl, namespace, "unlabelled")["phase"] == "Queued", st


def test_with_a_default_local_queue_it_is_admitted_and_runs(kueue, kubectl, operator, namespace):
    wait_quota_free(kubectl, "gpus")  # the Kueue tests before this module share the ClusterQueue
    kubectl.run("apply", "-f", "-", input=json.dumps(local_queue(namespace, "default", "gpus")))
    gang(kubectl, namespace, "defaulted", queue=None)
    wait_phase(kubectl, namespace, "defaulted", "Running", operator, timeout=60, nodes="2/2")
    assert job_of(kubectl, namespace, "defaulted")["metadata"]["labels"][c.LABEL_KUEUE_QUEUE] == "default"
    finish(kubectl, namespace, "defaulted")
    wait_phase(kubectl, namespace, "defaulted", "Succeeded", operator, timeout=60)
