"""`pip install .` as Python users expect it: the `finetune` command with the operator's light dependencies, the
trainer's stack as an extra, and ranges that admit the exact versions the images and the tests run (the locks)."""

import re
import tomllib

import pytest
from packaging.requirements import Requirement

from finetune_operator.cli.local_run import TRAINER_PACKAGES
from tests.conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCKED = {m.group(1).lower().replace("_", "-"): m.group(2)
          for lock in (ROOT / "requirements").glob("*.lock")
          for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s\\\\]+)", lock.read_text(), re.M)}
REQUIREMENTS = [(group, Requirement(r)) for group, reqs in
                [("dependencies", PROJECT["dependencies"]), *PROJECT["optional-dependencies"].items()] for r in reqs]


def test_the_finetune_command_is_installed_with_the_package():
    assert PROJECT["scripts"] == {"finetune": "finetune_operator.cli:main"}


@pytest.mark.parametrize(("group", "requirement"), REQUIREMENTS, ids=[f"{g}:{r.name}" for g, r in REQUIREMENTS])
def test_each_range_admits_the_locked_version(group, requirement):
    locked = LOCKED.get(requirement.name.lower())
    assert locked is not None, f"{requirement.name} ({group}) is in no requirements/*.lock"
    assert requirement.specifier.contains(locked, prereleases=True), (group, str(requirement), locked)


def test_the_light_install_has_no_trainer_package_and_the_extra_has_what_finetune_run_needs():
    light = {Requirement(r).name for r in PROJECT["dependencies"]}
    trainer = {Requirement(r).name for r in PROJECT["optional-dependencies"]["trainer"]}
    assert not light & {"torch", "transformers", "deepspeed", "peft", "datasets", "trl"}
    assert set(TRAINER_PACKAGES) <= trainer
