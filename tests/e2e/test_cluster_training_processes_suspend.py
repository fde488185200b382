"""A two-node job (pods as local processes) suspended at random moments never crashes or redoes a step
(tests/e2e/cluster_training.py holds the case; a file of its own, one of the longest e2e cases, so it has a
worker)."""

import pytest

from tests.e2e.cluster_training import (  # noqa: F401 - the case and its module fixture, collected here
    chart_operator,
    test_suspending_a_two_node_job_at_random_moments_never_crashes_or_redoes_a_step,
)


@pytest.fixture(scope="module", params=["processes"])
def runtime(request):
    return request.param
