"""The operator as a process against the session's control plane, one per test module (its log named after it)."""

import pytest

from tests.support.controlplane import free_port
from tests.support.operator_process import OperatorProcess


@pytest.fixture(scope="module")
def operator(kubectl, control_plane, request):
    log = control_plane.work / f"operator-{request.module.__name__.rsplit('.', 1)[-1]}.log"
    op = OperatorProcess(control_plane.kubeconfig, log, restart_backoff=1, metrics_port=free_port(),
                         env=getattr(request.module, "OPERATOR_ENV", None)).start()  # a module's own settings
    yield op
    op.stop()
