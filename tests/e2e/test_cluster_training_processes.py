"""The whole user flow with the operator and the trainer pods as local processes (tests/e2e/cluster_training.py
holds the cases; the suspend case is its own file, test_cluster_training_processes_suspend.py, so that it runs on
another worker)."""

import pytest

from tests.e2e.cluster_training import (  # noqa: F401 - the cases and their module fixture, collected here
    chart_operator,
    test_a_diverging_job_fails_at_once_with_its_reason_and_is_not_retried,
    test_two_node_job_trains_and_reports,
    test_two_nodes_upload_complete_checkpoints_to_a_bucket_with_a_claim_or_without,
)


@pytest.fixture(scope="module", params=["processes"])
def runtime(request):
    return request.param
