"""A real S3-compatible server for the tests: MinIO built from its Go module (hack/build-components.sh, cached like
the control plane), started on 127.0.0.1 with its own credentials and stopped at the end. Never a mock."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.controlplane import ROOT, free_port
from tests.support.port_retry import set_aside, start_on_free_ports

ACCESS_KEY, SECRET_KEY = "finetune-test", "finetune-test-secret-key"


def build_components() -> dict[str, Path]:
    """name -> directory of the components hack/build-components.sh builds (instant when cached)."""
    proc = subprocess.run(["bash", str(ROOT / "hack" / "build-components.sh")], check=True, text=True,
                          stdout=subprocess.PIPE)
    return {k: Path(v) for k, v in (line.split("=", 1) for line in proc.stdout.strip().splitlines() if "=" in line)}


@dataclass
class MinIO:
    binary: Path
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ftj-minio-")))
    port: int = 0
    proc: subprocess.Popen | None = None
    # At the lowest CPU priority: stands in for a store on other machines (benchmarks/object_storage.py).
    niced: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client needs: the credentials as boto reads them (a user's shell, a pod's Secret)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def start(self, port: int | None = None) -> MinIO:
        """Starts the server (again, on the same port and data, after stop())."""
        if port is not None:
            return self._start(port)
        return start_on_free_ports(lambda: self._start(free_port()), self._forget)

    def _forget(self) -> None:
        self.stop()
        set_aside(self.work / "minio.log")

    def _start(self, port: int) -> MinIO:
        self.port = port
        self.work.mkdir(parents=True, exist_ok=True)
        log = (self.work / "minio.log").open("ab")
        env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"}
        idle = ["ionice", "-c", "3"] if self.niced and shutil.which("ionice") else []
        # The console's port named too: left to MinIO, it is one the kernel hands out, which once was the very port
        # just picked for the server ("--console-address port cannot be same as --address port").
        console = free_port()
        while console == port:
            console = free_port()
        self.proc = subprocess.Popen([*idle, str(self.binary), "server", str(self.work / "data"), "--address",
                                      f"127.0.0.1:{self.port}", "--console-address", f"127.0.0.1:{console}",
                                      "--quiet"], env=env, stdout=log, stderr=log,
                                     preexec_fn=(lambda: os.nice(19)) if self.niced else None)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"minio exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/minio/health/live", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"minio did not become live in 60 s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        path = self.work / "minio.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=self.url, skip_instance_cache=True)

    def bucket(self, name: str) -> str:
        """A new, empty bucket; returns s3://name."""
        fs = self.filesystem()
        fs.mkdir(name)
        return f"s3://{name}"

    def complete_checkpoints(self, uri: str) -> set[int]:
        """Steps of the checkpoints under `uri` that carry FINETUNE_COMPLETE (read with the server's own keys)."""
        fs = self.filesystem()
        steps = set()
        for entry in fs.ls(uri, detail=False, refresh=True):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith("checkpoint-") and fs.exists(f"{entry}/FINETUNE_COMPLETE"):
                steps.add(int(name.removeprefix("checkpoint-")))
        return steps

    def stop(self, remove: bool = False) -> None:
        """Stops the server (a restart starts it again on the same data); `remove` also deletes its directory, for
        a session that passed (as ControlPlane.stop)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if remove:
            shutil.rmtree(self.work, ignore_errors=True)
