"""An elastic job with pods as local processes (tests/e2e/elastic_training.py holds the case): the twin of
test_cluster_training_containers_elastic.py, run with --twins."""

import pytest

from tests.e2e.cluster_training import chart_operator  # noqa: F401 - the module fixture
from tests.e2e.elastic_training import (  # noqa: F401 - the case, collected here
    test_an_elastic_job_restarts_in_place_shrinks_on_a_lost_node_and_grows_back,
)


@pytest.fixture(scope="module", params=["processes"])
def runtime(request):
    return request.param
