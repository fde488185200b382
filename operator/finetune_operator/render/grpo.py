"""What method.grpo adds to a trainer pod: each ConfigMap holding reward functions as a read-only volume, and where
the trainer finds it (trainer.json's rewardCode). The ConfigMap is the user's, in the job's namespace: mounting it is
what pod.volumes could do too, and its code runs in the trainer pods only, never in the operator."""

import posixpath
from typing import Any

from ..api import constants as c
from ..api.spec import FineTuneJobSpec


def reward_code_dirs(spec: FineTuneJobSpec) -> dict[str, str]:
    """ConfigMap name -> its mount path in the pod."""
    grpo = spec.method.grpo
    if spec.method.objective != "grpo" or grpo is None:
        return {}
    return {name: posixpath.join(c.REWARD_CODE_MOUNT_PATH, name) for name in grpo.config_maps}


def reward_code_volumes(spec: FineTuneJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volume mounts) of the pod."""
    volumes, mounts = [], []
    for i, (name, path) in enumerate(reward_code_dirs(spec).items()):
        volume = f"{c.REWARD_CODE_VOLUME_PREFIX}{i}"
        volumes.append({"name": volume, "configMap": {"name": name}})
        mounts.append({"name": volume, "mountPath": path, "readOnly": True})
    return volumes, mounts
