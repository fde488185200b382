"""The first cluster job page run as written with our images as podman containers: the chart's operator Deployment
and the trainer pod (tests/e2e/getting_started.py holds the case)."""

import pytest

from tests.e2e.getting_started import (  # noqa: F401 - the case and its module fixture, collected here
    hub_model,
    test_first_cluster_job_runs_as_written,
)


@pytest.fixture(scope="module", params=["containers"])
def runtime(request):
    return request.param
