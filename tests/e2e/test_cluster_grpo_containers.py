"""A 2-node GRPO job killed mid-run and resumed exactly, with its reward function from a ConfigMap
(tests/e2e/cluster_grpo.py holds the case), the trainer pods as our images' containers (podman)."""

import pytest

from tests.e2e.cluster_grpo import test_a_killed_grpo_gang_restarts_and_resumes_exactly  # noqa: F401
from tests.e2e.cluster_training import chart_operator  # noqa: F401 - the module fixture the case uses


@pytest.fixture(scope="module", params=["containers"])
def runtime(request):
    return request.param
