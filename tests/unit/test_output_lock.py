"""`finetune run`'s run directory: a second run on it is refused with advice that fits what holds it, and a
directory that cannot be written is said in one line (exit 78), not with a traceback."""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from finetune_operator.api import exit_codes
from finetune_operator.api.validation import validate_job
from finetune_operator.cli import local_run
from finetune_operator.cli.processes import OutputBusy, OutputLock
from tests.builders import make_job
from tests.conftest import ROOT

# A stand-in for `finetune run`: takes the lock, starts a "node" that inherits it (as start_nodes does), records
# it, says so and waits to be killed.
HOLDER = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    from finetune_operator.cli.processes import OutputLock
    lock = OutputLock(Path(sys.argv[1]))
    node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=(lock.fd,))
    lock.note_nodes([node.pid])
    print(node.pid, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def holder(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer_image")])}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    node = int(proc.stdout.readline())
    yield proc, node
    for pid in (proc.pid, node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def test_a_live_run_is_named_with_how_to_stop_it(tmp_path, holder):
    proc, _ = holder
    with pytest.raises(OutputBusy) as busy:
        OutputLock(tmp_path)
    assert f"is in use by another finetune run (pid {proc.pid}, started " in str(busy.value)
    assert f"stop it (Ctrl-C in its terminal, or kill -INT {proc.pid})" in str(busy.value)


def test_after_kill_9_the_message_names_the_nodes_still_stopping_not_a_dead_process(tmp_path, holder):
    """The issue: after kill -9 of `finetune run` the lock message said "stop it (Ctrl-C)" for a PID already dead,
    while its nodes, told to stop, were saving their checkpoint and still held the directory."""
    proc, node = holder
    proc.kill()
    proc.wait(timeout=30)
    with pytest.raises(OutputBusy) as busy:
        OutputLock(tmp_path)
    text = str(busy.value)
    assert f"the finetune run that used it (pid {proc.pid}, started " in text and "is gone" in text, text
    assert f"its node process(es) {node} still run" in text and f"kill {node}" in text, text
    assert "Ctrl-C" not in text
    os.kill(node, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the kernel drops the lock with its last holder
        try:
            OutputLock(tmp_path).release()
            break
        except OutputBusy:
            time.sleep(0.05)
    else:
        pytest.fail("the lock outlived its last holder")


@pytest.mark.parametrize("where", ["a path under a file", "/proc", "/sys"])
def test_an_output_that_cannot_be_written_is_one_clear_line(tmp_path, where):
    if where == "a path under a file":
        (tmp_path / "a-file").write_text("")
        target = tmp_path / "a-file" / "run"
    else:
        target = Path(where) / "finetune-run-test"
    job = validate_job(make_job({"spec.distributed.gpusPerNode": 0}))
    out = io.StringIO()
    assert local_run.run(job, target, out=out) == exit_codes.CONFIG_ERROR
    assert f"cannot write the run directory --output {target}" in out.getvalue(), out.getvalue()
    assert "Traceback" not in out.getvalue()
