"""The whole user flow with our images as podman containers (tests/e2e/cluster_training.py holds the cases)."""

import pytest

from tests.e2e.cluster_training import (  # noqa: F401 - the cases and their module fixture, collected here
    chart_operator,
    test_killed_node_gang_restarts_and_resumes_without_redoing_work,
    test_two_node_job_trains_and_reports,
    test_two_nodes_without_any_volume_resume_a_killed_gang_from_the_bucket,
)


@pytest.fixture(scope="module", params=["containers"])
def runtime(request):
    return request.param
