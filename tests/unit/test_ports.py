"""Ports for servers that start later (the rendezvous store, test servers): never from the ephemeral range."""

import random
import socket

from finetune_operator.cli.ports import ephemeral_start, free_port


def test_a_port_is_below_the_kernels_ephemeral_range_and_free(tmp_path):
    start = ephemeral_start()
    for _ in range(50):
        port = free_port()
        assert 10000 <= port < start
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))  # nobody holds it


def test_a_held_port_is_never_returned(tmp_path):
    """The same random sequence twice: the first pick, held by a listener, is skipped the second time."""
    first = free_port(random.Random(7))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen(1)
        assert free_port(random.Random(7)) != first


def test_an_unreadable_or_too_low_range_still_gives_a_free_port(tmp_path):
    missing = tmp_path / "missing"
    assert ephemeral_start(missing) == 32768
    low = tmp_path / "range"
    low.write_text("1024\t65535\n")  # nothing below it to choose from: the kernel's own pick
    port = free_port(range_file=low)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
