"""The write fence and the leader-election timing, pure: what may be written when, on the writer's own clock."""

import pytest

from finetune_operator.controller.fencing import Fence, NotLeading
from finetune_operator.controller.leadership import Timing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_leader_election_every_write_goes():
    Fence().check()


@pytest.mark.parametrize(("age", "allowed"), [(0.0, True), (5.99, True), (6.0, False), (60.0, False)],
                         ids=["just-renewed", "before-the-deadline", "at-the-deadline", "resumed-after-a-freeze"])
def test_a_leader_writes_only_within_the_renew_deadline_of_its_last_renewal(age, allowed):
    clock = Clock()
    fence = Fence(clock=clock)
    fence.lead(renew_deadline=6.0, write_timeout=3.0)
    fence.renewed(clock.now)
    clock.now += age
    if allowed:
        fence.check()
    else:
        with pytest.raises(NotLeading, match="may no longer write"):
            fence.check()


def test_a_leader_that_never_renewed_or_handed_the_lease_over_writes_nothing():
    clock = Clock()
    fence = Fence(clock=clock)
    fence.lead(renew_deadline=6.0, write_timeout=3.0)
    with pytest.raises(NotLeading, match="never"):
        fence.check()
    fence.renewed(clock.now)
    fence.check()
    fence.release()
    with pytest.raises(NotLeading, match="handed over"):
        fence.check()


def test_an_older_renewal_answered_late_does_not_move_the_fence_back():
    clock = Clock()
    fence = Fence(clock=clock)
    fence.renewed(50.0)
    fence.renewed(40.0)
    assert fence.renewed_at == 50.0


@pytest.mark.parametrize(("timing", "problem"), [
    (dict(lease_seconds=8, renew_deadline=6.0, write_timeout=3.0), "must fit in the lease"),
    (dict(lease_seconds=10, renew_deadline=6.0, write_timeout=3.0, margin=1.5), "must fit in the lease"),
    (dict(retry=6.0), "shorter than the renew deadline"),
], ids=["issue-41-timing", "no-margin-left", "retry-past-the-deadline"])
def test_a_timing_that_would_let_a_write_land_after_a_takeover_is_refused(timing, problem):
    with pytest.raises(ValueError, match=problem):
        Timing(**timing)


def test_the_default_timing_lands_every_write_before_a_standby_may_lead():
    t = Timing()
    assert t.renew_deadline + t.write_timeout + t.margin <= t.lease_seconds
    assert t.request_timeout < t.renew_deadline
