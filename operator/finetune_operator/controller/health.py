"""The operator's /healthz: live means able to reconcile, not merely a process that answers HTTP.

kopf's own endpoint is served by the event loop and answers as long as that loop runs, even with every reconcile
pass hung on a dead API connection. Ours fails when
- the event loop has not ticked for `loop_stall_seconds` (a blocking call on it: nothing is watched or reconciled),
- a reconcile pass has run for longer than `stuck_pass_seconds` (a pass is a few API calls: seconds at most),
- the lease renewal thread of a leader has died.
A standby answers 200 with its role: it is healthy, and a rolling update must be able to count it as ready.
Served by a plain thread, so a stuck loop cannot silence the probe that is meant to notice it.
"""

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Health:
    stuck_pass_seconds: float = 300.0
    loop_stall_seconds: float = 60.0
    clock: Callable[[], float] = time.monotonic
    role: str = "starting"
    loop_tick: float | None = None  # our clock; set by the event loop while kopf runs
    oldest_pass: Callable[[], float | None] = lambda: None  # start (our clock) of the longest-running pass
    renewer: threading.Thread | None = None

    def tick(self) -> None:
        self.loop_tick = self.clock()

    def verdict(self) -> tuple[bool, dict[str, object]]:
        """(healthy, what the probe answers)."""
        now = self.clock()
        report: dict[str, object] = {"role": self.role}
        problems = []
        if self.role == "leader":
            if self.loop_tick is not None:
                stalled = now - self.loop_tick
                report["loopTickAgeSeconds"] = round(stalled, 1)
                if stalled > self.loop_stall_seconds:
                    problems.append(f"the event loop has not run for {stalled:.0f} s")
            started = self.oldest_pass()
            if started is not None:
                age = now - started
                report["oldestPassSeconds"] = round(age, 1)
                if age > self.stuck_pass_seconds:
                    problems.append(f"a reconcile pass has run for {age:.0f} s (limit {self.stuck_pass_seconds:g})")
            if self.renewer is not None and not self.renewer.is_alive():
                problems.append("the lease renewal stopped")
        if problems:
            report["problems"] = problems
        return not problems, report


def serve(health: Health, host: str, port: int) -> ThreadingHTTPServer:
    """Serves GET /healthz from a daemon thread; returns the server (its port when 0 was asked)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/healthz":
                self.send_error(404)
                return
            ok, report = health.verdict()
            body = json.dumps(report).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server


HEALTH = Health()  # one per process: main.py sets the role, the kopf startup handler wires the controller in
