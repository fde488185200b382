"""Expectations: our own writes are trusted until the watch shows them, then forgotten."""

from finetune_operator.controller.expectations import Expectations


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_recorded_write_is_pending_until_its_ttl():
    clock = Clock()
    memory = Expectations(ttl_seconds=30, clock=clock)
    assert not memory.pending("a")
    memory.record("a")
    clock.now += 29.9
    assert memory.pending("a")
    clock.now += 0.2
    assert not memory.pending("a")
    assert not memory.pending("a")  # expired entries are dropped, not resurrected


def test_longer_ttl_for_infrastructure_and_forget():
    clock = Clock()
    memory = Expectations(ttl_seconds=30, clock=clock)
    memory.record("identity", ttl_seconds=300)
    memory.record("attempt")
    clock.now += 60
    assert memory.pending("identity") and not memory.pending("attempt")
    memory.forget("identity")
    assert not memory.pending("identity")


def test_sweep_bounds_memory_of_keys_never_asked_again():
    clock = Clock()
    memory = Expectations(ttl_seconds=1, clock=clock)
    for i in range(1023):
        memory.record(("old", i))
    clock.now += 2
    memory.record("new")  # the 1024th record sweeps
    assert len(memory._done) == 1


def test_forget_matching_drops_only_the_matching_keys():
    memory = Expectations(ttl_seconds=300, clock=Clock())
    for key in [("identity", "a", None), ("identity", "a", "custom"), ("identity", "b", None), ("attempt", "a")]:
        memory.record(key)
    memory.forget_matching(lambda key: key[:2] == ("identity", "a"))
    assert [k for k in [("identity", "a", None), ("identity", "a", "custom"), ("identity", "b", None),
                        ("attempt", "a")] if memory.pending(k)] == [("identity", "b", None), ("attempt", "a")]
