"""The Controller's pass scheduling, with a stand-in for the reconcile pass: coalescing, gathering, requeue
timers, API-error retries, our own status write seen before the watch delivers it, and shutdown."""

import asyncio
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from finetune_operator.controller import runner
from finetune_operator.controller.planning import Plan
from finetune_operator.controller.reconcile import Pass
from finetune_operator.controller.runner import Controller
from finetune_operator.controller.settings import Settings

KEY = ("ns", "job")


def ftj(version: str, phase: str | None = None) -> dict:
    return {"metadata": {"name": "job", "namespace": "ns", "resourceVersion": version},
            "status": {"phase": phase} if phase else {}}


def indexes(*finetunejobs: dict) -> dict:
    return {"finetunejob_index": {KEY: list(finetunejobs)}, "workload_index": {}}


class FakePasses:
    """Records the snapshot of each pass; a pass can be held open to let events arrive meanwhile."""

    def __init__(self, result=lambda view: Pass(Plan(status={"phase": "Running"}))):
        self.views, self.result = [], result
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def __call__(self, kube, view, settings, post_event, expectations):
        self.views.append(view)
        self.entered.set()
        self.hold.wait(5)
        return self.result(view)


def controller(passes: FakePasses, **settings) -> Controller:
    return Controller(kube=None, settings=Settings(workers=2, **settings), post_event=lambda *a: None,
                      reconcile_fn=passes)


def run(coro):
    return asyncio.run(coro)


def test_events_during_a_pass_fold_into_one_more_pass():
    passes = FakePasses()
    passes.hold.clear()
    ctl = controller(passes)

    async def scenario():
        first = asyncio.create_task(ctl.reconcile(KEY, indexes(ftj("1"))))
        while not passes.entered.is_set():
            await asyncio.sleep(0.01)
        for _ in range(5):  # five events while the pass runs
            await ctl.reconcile(KEY, indexes(ftj("2")))
        passes.hold.set()
        await first

    run(scenario())
    assert len(passes.views) == 2  # the first pass and one more for all five events
    assert passes.views[1].finetunejob["metadata"]["resourceVersion"] == "2"
    ctl.shutdown()


def test_workload_events_are_gathered_into_one_pass():
    passes = FakePasses()
    ctl = controller(passes)

    async def scenario():
        await asyncio.gather(*(ctl.reconcile(KEY, indexes(ftj("1")), gather=0.2) for _ in range(4)))

    run(scenario())
    assert len(passes.views) == 1
    ctl.shutdown()


def test_requeue_arms_one_timer_and_a_plan_without_one_cancels_it():
    plans = [Plan(status={}, requeue_after=30.0), Plan(status={})]
    passes = FakePasses(result=lambda view: Pass(plans.pop(0)))
    ctl = controller(passes)

    async def scenario():
        await ctl.reconcile(KEY, indexes(ftj("1")))
        timer = ctl.timers[KEY]
        assert 29 < timer.when() - asyncio.get_running_loop().time() <= 30
        await ctl.reconcile(KEY)
        assert KEY not in ctl.timers and timer.cancelled()

    run(scenario())
    ctl.shutdown()


def test_an_api_error_is_counted_and_retried_shortly():
    def failing(view):
        raise ApiException(status=503, reason="apiserver restarting")

    passes = FakePasses(result=failing)
    ctl = controller(passes)
    before = runner.metrics.API_ERRORS.labels("503")._value.get()

    async def scenario():
        await ctl.reconcile(KEY, indexes(ftj("1")))
        assert ctl.timers[KEY].when() - asyncio.get_running_loop().time() <= runner.API_RETRY_SECONDS

    run(scenario())
    assert runner.metrics.API_ERRORS.labels("503")._value.get() == before + 1
    ctl.shutdown()


def test_our_status_write_is_seen_until_the_watch_catches_up():
    written = {**ftj("8", "Running"), "apiVersion": "finetunejob.dev/v1alpha1", "kind": "FineTuneJob"}
    passes = FakePasses(result=lambda view: Pass(Plan(status={"phase": "Running"}), written=written, replaced="7"))
    ctl = controller(passes)

    async def scenario():
        await ctl.reconcile(KEY, indexes(ftj("7", "Pending")))
        await ctl.reconcile(KEY, indexes(ftj("7", "Pending")))  # the cache still shows the version we replaced
        await ctl.reconcile(KEY, indexes(ftj("9", "Running")))  # the watch moved past it: the cache wins again

    run(scenario())
    seen = [(v.finetunejob["metadata"]["resourceVersion"], v.finetunejob["status"].get("phase"))
            for v in passes.views]
    assert seen == [("7", "Pending"), ("8", "Running"), ("9", "Running")]
    ctl.shutdown()


def test_deleting_the_last_job_of_a_namespace_forgets_its_identity():
    ctl = controller(FakePasses())
    ctl.expectations.record(("identity", "ns", None))
    ctl.expectations.record(("identity", "other", None))
    ctl.deleted(KEY, namespace_empty=True)
    assert not ctl.expectations.pending(("identity", "ns", None))
    assert ctl.expectations.pending(("identity", "other", None))
    ctl.shutdown()


def test_shutdown_cancels_timers_and_stops_the_executor():
    passes = FakePasses(result=lambda view: Pass(Plan(status={}, requeue_after=60.0)))
    ctl = controller(passes)

    async def scenario():
        await ctl.reconcile(KEY, indexes(ftj("1")))
        timer = ctl.timers[KEY]
        ctl.shutdown()
        assert timer.cancelled() and ctl.timers == {}

    run(scenario())
    with pytest.raises(RuntimeError):
        ctl.executor.submit(print)
