"""The first cluster job page run as written, its operator and pods as processes from this checkout
(tests/e2e/getting_started.py holds the case; test_getting_started_containers.py runs it with our images)."""

import pytest

from tests.e2e.getting_started import (  # noqa: F401 - the case and its module fixture, collected here
    hub_model,
    test_first_cluster_job_runs_as_written,
)


@pytest.fixture(scope="module", params=["processes"])
def runtime(request):
    return request.param
