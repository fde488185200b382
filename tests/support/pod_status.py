"""What a kubelet writes into pod status when the trainer container exits."""

import time
from typing import Any

from finetune_operator.api import constants as c


def terminated(code: int, reason: str = "", message: str = "") -> dict[str, Any]:
    """A status patch body: phase from the exit code, the container's terminated state with its message."""
    reason = reason or ("Completed" if code == 0 else "Error")
    return {"status": {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
        "name": c.CONTAINER_NAME, "image": "trainer", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": reason, "message": message,
                                 "finishedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}}]}}
