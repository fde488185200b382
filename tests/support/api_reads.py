"""`kubectl get ... -o json` answered in-process, for the tests' polling loops.

The test kubelet polls its pods three times a second and every wait polls a status twice a second: as kubectl
processes that was ~9,000 starts in a full run (~0.07 CPU-s each, about a sixth of the suite's CPU on 2 cores).
A kubelet or a watcher holds a connection instead; so does this: one kept-alive HTTPS connection per thread, the
same GET kubectl would send, and the same JSON it would print (lists as a `List` whose items carry kind and
apiVersion, managedFields left out). Only plain reads are answered here; anything else (other flags, several
types, an error from the server) returns None and the caller runs the real kubectl, so failures read as before.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


class ApiReads:
    def __init__(self, kubeconfig: Path):
        self.kubeconfig = kubeconfig
        self._local = threading.local()
        self._lock = threading.Lock()
        self._resources: dict[str, dict[str, Any]] | None = None
        self._config_mtime = -1.0
        self._server = ("", 0)
        self._token = ""
        self._default_namespace = "default"

    def get(self, args: Sequence[str]) -> dict | None:
        """What `kubectl ARGS -o json` prints, or None where this does not answer it."""
        query = _parse(args)
        if query is None:
            return None
        resource = self._resource(query["type"])
        if resource is None:
            return None
        base = f"{resource['prefix']}/{resource['plural']}"
        if resource["namespaced"] and not query["all"]:
            namespace = query["namespace"] or self._default_namespace
            base = f"{resource['prefix']}/namespaces/{namespace}/{resource['plural']}"
        if query["name"]:
            doc = self._get(f"{base}/{urllib.parse.quote(query['name'])}")
            return None if doc is None else _without_managed_fields(doc)
        params = {k: v for k, v in (("labelSelector", query["labels"]), ("fieldSelector", query["fields"])) if v}
        doc = self._get(base + (f"?{urllib.parse.urlencode(params)}" if params else ""))
        if doc is None:
            return None
        items = [_without_managed_fields({"apiVersion": resource["apiVersion"], "kind": resource["kind"], **item})
                 for item in doc.get("items") or []]
        return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}

    # --- the connection ----------------------------------------------------------------------------------------
    def _load_config(self) -> None:
        mtime = self.kubeconfig.stat().st_mtime
        if mtime == self._config_mtime:
            return
        config = yaml.safe_load(self.kubeconfig.read_text())
        url = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
        self._server = (url.hostname or "127.0.0.1", url.port or 443)
        self._token = config["users"][0]["user"]["token"]
        self._default_namespace = config["contexts"][0]["context"].get("namespace") or "default"
        self._config_mtime = mtime

    def _get(self, path: str) -> dict | None:
        self._load_config()
        reconnects = throttles = 0
        while True:
            conn = getattr(self._local, "conn", None)
            if conn is None or (conn.host, conn.port) != self._server:
                context = ssl._create_unverified_context()  # the loopback test server's self-signed certificate
                conn = self._local.conn = http.client.HTTPSConnection(*self._server, context=context, timeout=30)
            try:
                conn.request("GET", path, headers={"Authorization": f"Bearer {self._token}",
                                                   "Accept": "application/json"})
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                # A connection the server closed (idle, or a restarted apiserver) is opened again once.
                conn.close()
                self._local.conn = None
                reconnects += 1
                if reconnects > 1:
                    return None
                continue
            # 429 with Retry-After (e.g. "storage is (re)initializing" just after a CRD is established): kubectl's
            # client waits and asks again, up to 10 times.
            if response.status == 429 and throttles < 10:
                throttles += 1
                time.sleep(min(float(response.getheader("Retry-After") or 1), 5.0))
                continue
            return json.loads(body) if response.status == 200 else None

    # --- discovery, as kubectl's: the core group first, then the groups in the server's order --------------------
    def _resource(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            for refresh in (False, True):  # a CRD created since the last look is found after one more discovery
                if self._resources is None or refresh:
                    self._resources = self._discover()
                if self._resources is None:
                    return None
                found = self._resources.get(name.lower())
                if found is not None:
                    return found
        return None

    def _discover(self) -> dict[str, dict[str, Any]] | None:
        versions = ["/api/v1"]
        groups = self._get("/apis")
        if groups is None:
            return None
        versions += [f"/apis/{g['preferredVersion']['groupVersion']}" for g in groups.get("groups", [])]
        names: dict[str, dict[str, Any]] = {}
        for prefix in versions:
            listing = self._get(prefix)
            if listing is None:
                continue
            group = listing["groupVersion"].split("/")[0] if "/" in listing["groupVersion"] else ""
            for r in listing.get("resources", []):
                if "/" in r["name"] or "get" not in r.get("verbs", []):
                    continue
                entry = {"prefix": prefix, "plural": r["name"], "namespaced": r["namespaced"], "kind": r["kind"],
                         "apiVersion": listing["groupVersion"]}
                aliases = [r["name"], r.get("singularName") or "", r["kind"].lower(), *r.get("shortNames", [])]
                if group:
                    aliases += [f"{r['name']}.{group}", f"{r['kind'].lower()}.{group}"]
                for alias in filter(None, aliases):
                    names.setdefault(alias.lower(), entry)
        return names


def _parse(args: Sequence[str]) -> dict[str, Any] | None:
    """`get TYPE [NAME] [-n NS] [-l SEL] [--field-selector SEL] [-A]` (or TYPE/NAME); None for anything else."""
    if not args or args[0] != "get":
        return None
    query: dict[str, Any] = {"type": "", "name": "", "namespace": "", "labels": "", "fields": "", "all": False}
    words = list(args[1:])
    positional: list[str] = []
    flags = {"-n": "namespace", "--namespace": "namespace", "-l": "labels", "--selector": "labels",
             "--field-selector": "fields"}
    while words:
        word = words.pop(0)
        key, _, value = word.partition("=")
        if key in flags:
            if not value:
                if not words:
                    return None
                value = words.pop(0)
            query[flags[key]] = value
        elif word in ("-A", "--all-namespaces"):
            query["all"] = True
        elif word.startswith("-"):
            return None
        else:
            positional.append(word)
    if len(positional) == 1 and positional[0].count("/") == 1:
        positional = positional[0].split("/")
    if not positional or len(positional) > 2 or "," in positional[0] or not all(positional):
        return None
    query["type"] = positional[0]
    query["name"] = positional[1] if len(positional) == 2 else ""
    if query["name"] and (query["labels"] or query["fields"] or query["all"]):
        return None
    return query


def _without_managed_fields(obj: dict) -> dict:
    """kubectl prints objects without metadata.managedFields unless asked (--show-managed-fields)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj
