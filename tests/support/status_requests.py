"""A FineTuneJob's status subresource read or patched with a given token, as a trainer does it (one HTTP request:
`kubectl patch` would get the object first, which a trainer's identity may not)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from finetune_operator.api import constants as c


def status_request(control_plane, token: str, method: str, namespace: str, job: str, status: dict | None = None
                   ) -> tuple[int, str]:
    """(HTTP code, body) of a GET or merge PATCH of a job's status subresource, as `token`."""
    url = f"{control_plane.server}/apis/{c.API_VERSION}/namespaces/{namespace}/{c.PLURAL}/{job}/status"
    body = json.dumps({"status": status}).encode() if status is not None else None
    request = urllib.request.Request(url, data=body, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl._create_unverified_context()) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
