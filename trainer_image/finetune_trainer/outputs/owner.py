"""Who writes an output.uri prefix: an owner record in the bucket (`<uri>/.finetune-owner.json`), so that two runs
never write one prefix at once (the second would resume from the first's checkpoints while it trains, and both
would rotate and overwrite each other's).

The record is a lease: the run that claims it renews it every RENEW_SECONDS and releases it when its trainer
exits (done, failed or stopped). Another run is refused while the lease is held and fresh; a run of the same
writer (the same FineTuneJob, by UID, on a gang restart; the same `finetune run --output` on this host) takes it
at once; a lease not renewed for LEASE_SECONDS (a holder killed with SIGKILL, a lost node) is taken over with a
note; `finetune run --take-over` takes over a live one on purpose, and the run that held it stops writing at its
next checkpoint (every node checks the record before each upload). Ages are read on the store's clock (the
records' LastModified), never compared with this machine's."""

import atexit
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from finetune_operator.api import constants as c
from finetune_trainer import objectstore
from finetune_trainer.errors import ConfigError

log = logging.getLogger(__name__)
OWNER_FILE = ".finetune-owner.json"
RENEW_SECONDS = 60.0
LEASE_SECONDS = 300.0  # five renewals missed: the holder is gone
_HELD: set["OwnerRecord"] = set()  # the records this process wrote as its own and has not released


def release_held() -> None:
    """Releases every lease this process holds: at its exit (atexit), and before an exit that skips atexit
    (os._exit). A SIGKILL still leaves the lease to expire."""
    for record in list(_HELD):
        record.release()


class OwnershipLost(ConfigError):
    """Another run took the output.uri prefix over (finetune run --take-over): this one writes no more there."""


@dataclass(frozen=True)
class Writer:
    """Who a run is, as the record names it: `id` decides (the same id is the same writer), `who` is for people."""

    id: str
    who: str


def writer_of(job_name: str, namespace: str, job_uid: str | None, output_dir: Any) -> Writer:
    """A FineTuneJob by its UID (its attempts are one writer; a job created again under the name is another), a
    `finetune run` by this host and its run directory (its output lock already keeps one run per directory)."""
    if job_uid:
        return Writer(f"job:{job_uid}", f"FineTuneJob {namespace}/{job_name} (uid {job_uid})")
    host = socket.gethostname()
    return Writer(f"local:{host}:{output_dir}", f"finetune run of {job_name} on {host} with output {output_dir}")


def take_over_asked() -> bool:
    return os.environ.get(c.ENV_OUTPUT_TAKE_OVER, "") == "1"


class OwnerRecord:
    """The lease on one prefix for one writer: claim() on the run's main process, verify() before any write."""

    def __init__(self, uri: str, writer: Writer, take_over: bool = False):
        self.uri, self.writer, self.take_over = uri.rstrip("/"), writer, take_over
        self.path = f"{self.uri}/{OWNER_FILE}"
        self.lost: OwnershipLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the record ---------------------------------------------------------------------------------------------
    def read(self, age: bool = True) -> tuple[dict[str, Any] | None, float | None]:
        """The record and (when `age`) its age in seconds on the store's clock; (None, None) when there is none."""
        fs = objectstore.filesystem()
        try:
            body = fs.cat_file(self.path)
            written = fs.info(self.path, refresh=True).get("LastModified") if age else None
        except FileNotFoundError:
            return None, None
        try:
            record = json.loads(body)
        except ValueError:
            record = {}
        return (record if isinstance(record, dict) else {}), self._age(written)

    def _age(self, written: Any) -> float | None:
        """Seconds since `written` (the record's LastModified) by the store's clock: a probe's LastModified."""
        if written is None:
            return None
        fs = objectstore.filesystem()
        probe = f"{self.uri}/.finetune-clock-{os.getpid()}"
        fs.pipe_file(probe, b"")
        try:
            now = fs.info(probe, refresh=True).get("LastModified")
        finally:
            fs.rm_file(probe)
        return max(0.0, (now - written).total_seconds()) if now is not None else None

    def _write(self, since: str | None = None, released: bool = False) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"owner": self.writer.id, "writer": self.writer.who, "host": socket.gethostname(), "pid": os.getpid(),
                "since": since or now, "renewedAt": now, "released": released}
        objectstore.filesystem().pipe_file(self.path, json.dumps(body).encode())

    # --- the lease ----------------------------------------------------------------------------------------------
    def check(self) -> None:
        """claim()'s judgement without taking the lease (the preflight): ConfigError when another run holds it."""
        try:
            record, age = self.read()
        except Exception as exc:  # s3fs and botocore raise many types
            raise objectstore.failure(exc, self.uri, ConfigError) from exc
        self._judge(record, age)

    def claim(self) -> str | None:
        """Takes the prefix for this writer, or raises ConfigError naming the holder and the ways out. Returns a
        note for the console when it took a lease over (an expired one, or on request). Renewed until release()."""
        try:
            record, age = self.read()
            note = self._judge(record, age)
            # Held from before the write: a stop signal that lands between the write and the end of claim() ends
            # the process through its exit handlers, and they release the record (a record another writer holds
            # by then is left alone).
            self._hold()
            self._write()
            # Two runs that claimed at the same moment: the later write stands, the earlier one sees it here.
            mine, _ = self.read(age=False)
        except ConfigError:
            raise
        except Exception as exc:  # s3fs and botocore raise many types
            raise objectstore.failure(exc, self.uri, ConfigError) from exc
        if (mine or {}).get("owner") != self.writer.id:
            _HELD.discard(self)
            raise ConfigError(self._busy(mine or {}, 0.0))
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, name="output-owner", daemon=True)
            self._thread.start()
        return note

    def _hold(self) -> None:
        """Whatever ends the trainer (done, a failure, a stop) releases the lease; a SIGKILL lets it expire."""
        # Registered once, and last: after the store's client is loaded, so it runs before the client's own exit
        # handlers (last registered, first run), while it can still write.
        atexit.unregister(release_held)
        atexit.register(release_held)
        _HELD.add(self)
        self._stop.clear()

    def _judge(self, record: dict[str, Any] | None, age: float | None) -> str | None:
        if record is None or record.get("released") or record.get("owner") == self.writer.id:
            return None
        holder = record.get("writer") or record.get("owner") or "another run"
        if age is not None and age > LEASE_SECONDS:
            return (f"{self.uri} was held by {holder}, which stopped renewing its lease {age / 60:.0f} min ago "
                    "(killed, or its node was lost): taken over")
        if self.take_over:
            return f"{self.uri} was held by {holder}: taken over on request (--take-over); it writes no more there"
        raise ConfigError(self._busy(record, age))

    def _busy(self, record: dict[str, Any], age: float | None) -> str:
        holder = record.get("writer") or record.get("owner") or "another run"
        renewed = f", lease renewed {age:.0f} s ago" if age is not None else ""
        return (f"spec.output.uri {self.uri} is being written by {holder} (since {record.get('since', '?')}"
                f"{renewed}); two runs writing one prefix would resume from and overwrite each other's checkpoints. "
                "Wait for that run to end (or stop it), give this one another output.uri, or take the prefix over: "
                f"`finetune run --take-over` (the other run then stops uploading); a holder that was killed loses "
                f"its lease {LEASE_SECONDS / 60:.0f} min after its last renewal")

    def verify(self) -> None:
        """Raises OwnershipLost when another writer holds the record now (checked before every checkpoint upload,
        on every node); an unreadable record is not a reason to stop (the upload's own retries handle outages)."""
        if self.lost is not None:
            raise self.lost
        try:
            record, _ = self.read(age=False)
        except Exception:  # s3fs and botocore raise many types: judged by the upload that follows
            return
        if record is not None and not record.get("released") and record.get("owner") != self.writer.id:
            holder = record.get("writer") or record.get("owner")
            self.lost = OwnershipLost(f"{self.uri} was taken over by {holder} (since {record.get('since', '?')}): "
                                      "this run uploads nothing more there; its checkpoints and model stay in its "
                                      "local output directory")
            raise self.lost

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                record, _ = self.read(age=False)
                if record is not None and record.get("owner") != self.writer.id:
                    self.verify()
                    return
                self._write(since=(record or {}).get("since"))
            except OwnershipLost:
                return
            except Exception as exc:  # an outage: the next renewal tries again
                log.warning("could not renew the lease on %s: %s", self.uri, objectstore.explain(exc, self.uri))

    def release(self) -> None:
        """Marks the record released when it is still this writer's; never fails the run (an expired lease is
        the fallback)."""
        self._stop.set()
        if self not in _HELD:
            return
        _HELD.discard(self)
        self._thread = None
        try:
            record, _ = self.read(age=False)
            if record is not None and record.get("owner") == self.writer.id:
                self._write(since=record.get("since"), released=True)
        except Exception as exc:  # s3fs and botocore raise many types
            log.warning("could not release the lease on %s: %s", self.uri, objectstore.explain(exc, self.uri))
