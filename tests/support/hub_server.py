"""A stand-in for the Hugging Face Hub's HTTP API (no Hub here): the endpoints huggingface_hub's create_repo,
create_branch and upload_folder call, with the Hub's status codes, so the real client library runs unchanged.

Files are taken as regular (base64 in the commit), never LFS. `unavailable` answers every request with 503 (the
client retries some requests itself, not repository creation); `refuse` answers every write with 403; a wrong token
gets 401, as on the Hub. `role` is the token's role whoami reports: a `read` token may find an existing repository
(409, which create_repo(exist_ok=True) accepts) but gets 403 on a new one and on every commit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[dict[str, Any]] = field(default_factory=list)


class StandInHub:
    def __init__(self, token: str):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.unavailable = False
        self.refuse = False
        self.role = "write"
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandInHub:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo: str, revision: str = "main") -> dict[str, bytes]:
        return self.repos[repo].branches[revision]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # the test reads hub.requests instead
                pass

            def do_GET(self) -> None:
                hub.requests.append(f"GET {self.path}")
                if hub.unavailable:
                    return self._send(503, {"error": "Service Unavailable"})
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                if self.path.split("?")[0] != "/api/whoami-v2":
                    return self._send(404, {"error": "Not Found"})
                return self._send(200, {"type": "user", "name": "acme", "auth": {
                    "type": "access_token", "accessToken": {"displayName": "ci", "role": hub.role}}})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append(f"POST {self.path}")
                if hub.unavailable:
                    return self._send(503, {"error": "Service Unavailable"})
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                if hub.refuse:
                    return self._send(403, {"error": "You don't have the rights to create a model under this "
                                                     "namespace"})
                with hub._lock:
                    if hub.role == "read" and not self._exists(body):
                        return self._send(403, {"error": "You don't have the rights to write to this repo"})
                    self._route(body)

            def _exists(self, body: bytes) -> bool:
                """A repository creation for one that exists (the only write a read token gets an answer to)."""
                if self.path.split("?")[0] != "/api/repos/create":
                    return False
                doc = json.loads(body)
                name = f"{doc['organization']}/{doc['name']}" if doc.get("organization") else doc["name"]
                return name in hub.repos

            def _route(self, body: bytes) -> None:
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    return self._create(json.loads(body))
                if path == "/api/validate-yaml":
                    return self._validate(json.loads(body))
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit|branch)/(.+)", path)
                if m is None or m.group(1) not in hub.repos:
                    return self._send(404, {"error": "Repository not found"})
                repo, action, revision = hub.repos[m.group(1)], m.group(2), m.group(3)
                if action == "branch":
                    if revision in repo.branches:
                        return self._send(409, {"error": "Branch already exists"})
                    repo.branches[revision] = dict(repo.branches["main"])
                    return self._send(200, {})
                if revision not in repo.branches:
                    return self._send(404, {"error": f"Revision {revision} not found"})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                       "shouldIgnore": False} for f in files]})
                return self._commit(m.group(1), repo, revision, body)

            def _create(self, doc: dict[str, Any]) -> None:
                repo_id = f"{doc['organization']}/{doc['name']}" if doc.get("organization") else doc["name"]
                if repo_id in hub.repos:
                    return self._send(409, {"error": "You already created this model repo",
                                            "url": f"{hub.url}/{repo_id}"})
                hub.repos[repo_id] = Repo(private=doc.get("visibility") == "private" or bool(doc.get("private")))
                return self._send(200, {"url": f"{hub.url}/{repo_id}"})

            def _validate(self, doc: dict[str, Any]) -> None:
                parts = doc["content"].split("---")
                try:
                    yaml.safe_load(parts[1] if len(parts) > 2 else "")
                except yaml.YAMLError as exc:
                    return self._send(400, {"error": f"Invalid metadata in README.md: {exc}"})
                return self._send(200, {"warnings": [], "errors": []})

            def _commit(self, repo_id: str, repo: Repo, revision: str, body: bytes) -> None:
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                added = {}
                for line in lines:
                    if line["key"] == "file":
                        added[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
                    elif line["key"] not in ("header",):
                        return self._send(400, {"error": f"unsupported commit operation {line['key']}"})
                repo.branches[revision].update(added)
                oid = hashlib.sha1(body).hexdigest()
                header = next(line["value"] for line in lines if line["key"] == "header")
                repo.commits.append({"oid": oid, "summary": header["summary"], "files": sorted(added),
                                     "revision": revision})
                return self._send(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid,
                                        "success": True})

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
