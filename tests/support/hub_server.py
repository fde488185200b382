"""A stand-in for the Hugging Face Hub's HTTP API (no Hub here): the endpoints huggingface_hub's create_repo,
create_branch and upload_folder call, and those its downloads call (hf_hub_download's HEAD and GET of
/<repo>/resolve/<revision>/<file>, model_info, list_repo_tree), with the Hub's status codes and headers, so the real
client library runs unchanged. `serve_model(repo_id, directory)` publishes a local model under a Hub id: the tests
point HF_ENDPOINT here and the pages' commands name the real id.

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
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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

    def serve_model(self, repo_id: str, directory: Path, private: bool = False) -> None:
        """Every file under `directory` as the main branch of a (public) model repository `repo_id`."""
        files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
                 if p.is_file()}
        self.repos[repo_id] = Repo(private=private, branches={"main": files})

    def downloads(self) -> list[str]:
        """The files the clients fetched (GET of /<repo>/resolve/<revision>/<file>), in order."""
        return [r.split(" ", 1)[1] for r in self.requests if r.startswith("GET ") and "/resolve/" in r]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # the test reads hub.requests instead
                pass

            def do_HEAD(self) -> None:
                hub.requests.append(f"HEAD {self.path}")
                self._read(body=False)

            def do_GET(self) -> None:
                hub.requests.append(f"GET {self.path}")
                if self.path.split("?")[0] != "/api/whoami-v2":
                    return self._read(body=True)
                if hub.unavailable:
                    return self._send(503, {"error": "Service Unavailable"})
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
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

            # --- reads: what from_pretrained, hf_hub_download and snapshot_download ask -------------------
            def _read(self, body: bool) -> None:
                if hub.unavailable:
                    return self._send(503, {"error": "Service Unavailable"}, body=body)
                auth = self.headers.get("Authorization")
                if auth is not None and auth != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization header"}, body=body)
                path = urllib.parse.unquote(self.path.split("?")[0])
                m = (re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                     or re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(?:revision|tree)/([^/]+))?(/.*)?", path))
                if m is None:
                    return self._send(404, {"error": "Not Found"}, body=body)
                repo_id, revision = m.group(1), m.group(2) or "main"
                repo = hub.repos.get(repo_id)
                if repo is None or (repo.private and auth is None):  # the Hub does not say which
                    return self._send(401, {"error": "Repository not found"}, body=body,
                                      headers={"X-Error-Code": "RepoNotFound"})
                files = self._revision(repo, revision)
                if files is None:
                    return self._send(404, {"error": f"Invalid rev id: {revision}"}, body=body,
                                      headers={"X-Error-Code": "RevisionNotFound"})
                sha = _commit_sha(files)
                if "/resolve/" in path:
                    return self._file(files, m.group(3), sha, body)
                if "/tree/" in path:
                    prefix = (m.group(3) or "").strip("/")
                    entries = [{"type": "file", "path": name, "size": len(data), "oid": _sha1(data)}
                               for name, data in sorted(files.items())
                               if not prefix or name.startswith(prefix + "/")]
                    return self._send(200, entries, body=body)
                return self._send(200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private,
                                        "siblings": [{"rfilename": name} for name in sorted(files)]}, body=body)

            def _revision(self, repo: Repo, revision: str) -> dict[str, bytes] | None:
                if revision in repo.branches:
                    return repo.branches[revision]
                return next((files for files in repo.branches.values() if _commit_sha(files) == revision), None)

            def _file(self, files: dict[str, bytes], name: str, sha: str, body: bool) -> None:
                if name not in files:
                    return self._send(404, {"error": "Entry not found"}, body=body,
                                      headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha})
                data = files[name]
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{_sha1(data)}"')
                self.send_header("X-Repo-Commit", sha)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _send(self, status: int, doc: Any, body: bool = True, headers: dict[str, str] | None = None
                      ) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        return Handler


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _commit_sha(files: dict[str, bytes]) -> str:
    """A revision's commit id: a digest of its files, so the same content is the same commit."""
    digest = hashlib.sha1()
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + _sha1(data).encode())
    return digest.hexdigest()
