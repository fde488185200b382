"""The API server as a tenant reaches it: every write path (create, update, merge/JSON/strategic patch, server-side
apply), as one user (impersonated by the admin, as `kubectl --as`) or with one bearer token (a ServiceAccount's),
as a server-side dry run (admission runs in full, nothing is stored: one object can take thousands of cases).

One kept-alive HTTPS connection per thread; answers are (HTTP status, the JSON body): the stored object a dry run
would leave, or the API server's Status with its message.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from finetune_operator.api import constants as c

PATCH_TYPES = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
               "strategic": "application/strategic-merge-patch+json", "apply": "application/apply-patch+yaml"}


@dataclass
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def admitted(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


@dataclass
class TenantApi:
    kubeconfig: Path
    user: str | None = None  # impersonated by the kubeconfig's admin
    token: str | None = None  # or this bearer token (a ServiceAccount's)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        config = yaml.safe_load(self.kubeconfig.read_text())
        url = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
        self._server = (url.hostname or "127.0.0.1", url.port or 443)
        self._admin = config["users"][0]["user"]["token"]

    def _path(self, namespace: str, name: str = "", subresource: str = "") -> str:
        path = f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{namespace}/{c.PLURAL}"
        return path + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: dict[str, str] | None = None) -> Answer:
        headers = {"Accept": "application/json", "Content-Type": content_type,
                   "Authorization": f"Bearer {self.token or self._admin}"}
        if self.user is not None:
            headers["Impersonate-User"] = self.user
        if query:
            path += "?" + urllib.parse.urlencode(query)
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
        for attempt in range(2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                context = ssl._create_unverified_context()  # the loopback test server's self-signed certificate
                conn = self._local.conn = http.client.HTTPSConnection(*self._server, context=context, timeout=60)
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()  # a connection the server closed is opened again once
                self._local.conn = None
                if attempt:
                    raise
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"message": raw.decode(errors="replace")}
        return Answer(response.status, parsed)

    # --- the write paths, each a dry run with strict field validation (an unknown field is an error) -----------
    DRY = {"dryRun": "All", "fieldValidation": "Strict"}

    def get(self, namespace: str, name: str) -> Answer:
        return self.request("GET", self._path(namespace, name))

    def create(self, obj: dict[str, Any]) -> Answer:
        return self.request("POST", self._path(obj["metadata"]["namespace"]), obj, query=self.DRY)

    def update(self, obj: dict[str, Any]) -> Answer:
        meta = obj["metadata"]
        return self.request("PUT", self._path(meta["namespace"], meta["name"]), obj, query=self.DRY)

    def patch(self, namespace: str, name: str, how: str, body: Any, manager: str = "tenant") -> Answer:
        query = dict(self.DRY)
        if how == "apply":
            query.update(fieldManager=manager, force="true")
        return self.request("PATCH", self._path(namespace, name), body, content_type=PATCH_TYPES[how], query=query)
