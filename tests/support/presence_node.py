"""One node of an elastic rendezvous (torch's c10d handler, min 2, max 3) with finetune_trainer.presence attached
as the agent attaches it, and nothing else: no workers, so a test decides when each node joins a round. Node "a"
hosts the store. The keep-alive window is a minute, so a member left out sooner was swept by its presence port.

python tests/support/presence_node.py PORT WORKDIR NAME [--rejected]

Joins a round and writes WORKDIR/<name>.round-1.json ({"world", "rank"}); once WORKDIR/again exists, joins the next
and writes round-2; then keeps its keep-alives going until killed. WORKDIR/<name>.sweeps holds its sweep count.
--rejected: the node publishes a port nothing listens on, as a firewall that rejects its real one looks to the
others (refused, whether the node is alive or not)."""

import json
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

KEEP_ALIVE_SECONDS, KEEP_ALIVE_MISSED = 1, 60
ROUND_1_LAST_CALL = 240  # a round of max_nodes (3) closes at once: this only waits for a slow starter


def main(port: int, workdir: str, name: str, rejected: bool) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from finetune_trainer.presence import Presence

    folder = Path(workdir)
    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="presence", min_nodes=2, max_nodes=3,
        local_addr="127.0.0.1", is_host=name == "a", join_timeout=300, last_call_timeout=ROUND_1_LAST_CALL,
        keep_alive_interval=KEEP_ALIVE_SECONDS, keep_alive_max_attempt=KEEP_ALIVE_MISSED))
    presence = Presence(handler)
    if rejected:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            handler._store.set(presence._key(handler._this_node), str(closed.getsockname()[1]))

    def count() -> None:
        while True:
            (folder / f"{name}.sweeps").write_text(str(presence.sweeps))
            time.sleep(0.2)

    threading.Thread(target=count, daemon=True).start()
    for round_ in (1, 2):
        if round_ == 2:
            while not (folder / "again").exists():
                time.sleep(0.05)
            # Round 1 waits for all three (a node importing torch on a loaded machine missed a 1 s last call and
            # waited for a round 2 that never came); round 2 is of two, closed 1 s after both are in.
            handler._settings.timeout._last_call = timedelta(seconds=1)
        info = handler.next_rendezvous()
        done = folder / f"{name}.round-{round_}.json"  # whole or absent for the test that polls it
        done.with_suffix(".tmp").write_text(json.dumps({"world": info.world_size, "rank": info.rank}))
        done.with_suffix(".tmp").replace(done)
    time.sleep(600)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], rejected=sys.argv[4:] == ["--rejected"])
