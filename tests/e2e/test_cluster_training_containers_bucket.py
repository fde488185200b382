"""Two nodes as podman containers with no volume at all: a killed gang resumes from the bucket alone
(tests/e2e/cluster_training.py holds the case; a file of its own, the longest e2e case, so it has a worker)."""

import pytest

from tests.e2e.cluster_training import (  # noqa: F401 - the case and its module fixture, collected here
    chart_operator,
    test_two_nodes_upload_complete_checkpoints_to_a_bucket_with_a_claim_or_without,
    test_two_nodes_without_any_volume_resume_a_killed_gang_from_the_bucket,
)

# The suite's 1,800 s backstop (pyproject) is for a hung test; these cases' own waits fail a job that stands still
# (nothing new in its status or its pods' files for minutes). Beside two CPU hogs (load ~20) three of them took
# 1,488-1,808 s while progressing all along, and the backstop failed the one that needed 1,808: a busy machine makes
# them slow, not hung.
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module", params=["containers"])
def runtime(request):
    return request.param
