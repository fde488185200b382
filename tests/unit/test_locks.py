"""requirements/*.lock: what the images and the test venv install (--require-hashes). They must follow their inputs
and agree with each other, so the operator image, the trainer image and the tests run the same versions."""

import re
import subprocess
import sys
from importlib.metadata import version

from tests.conftest import ROOT

REQ = ROOT / "requirements"


def pins(lock: str) -> dict[str, str]:
    text = (REQ / lock).read_text()
    return {name.lower().replace("_", "-"): v for name, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def test_every_lock_follows_its_inputs():
    proc = subprocess.run([sys.executable, str(ROOT / "hack" / "lock_requirements.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_locked_package_has_hashes_and_the_locks_agree():
    locks = ["operator.lock", "build.lock", "trainer.lock", "trainer-nobuildisolation.lock"]
    for lock in locks:
        entries = re.split(r"\n(?=[A-Za-z])", (REQ / lock).read_text().split("\n", 2)[2])
        assert entries and all("--hash=sha256:" in e for e in entries if e.strip()), lock
    seen: dict[str, tuple[str, str]] = {}
    for lock in locks:
        for name, v in pins(lock).items():
            assert seen.setdefault(name, (v, lock))[0] == v, f"{name}: {v} in {lock}, {seen[name]}"
    # The test venv (hack/setup-python.sh) runs exactly the locked versions.
    for name in ("torch", "transformers", "peft", "deepspeed", "kopf", "kubernetes", "pydantic", "datasets"):
        assert version(name) == seen[name][0], name


def test_the_cuda_image_compiles_with_the_cuda_version_torch_runs():
    runtime, build = pins("trainer.lock"), pins("cuda-build.lock")
    cuda = runtime["nvidia-cuda-runtime"]
    assert runtime["nvidia-cuda-cccl"] == cuda  # CCCL's headers refuse an nvcc of another minor version
    assert build["nvidia-cuda-nvcc"] == build["nvidia-cuda-crt"] == build["nvidia-nvvm"] == cuda, (build, cuda)
