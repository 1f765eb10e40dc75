"""A local Hugging Face Hub for tests: the routes shardstream and huggingface_hub use, on two hosts.

Written from huggingface_hub 2.4.0's client code (``hf_api.HfApi.dataset_info``,
``HfApi._iter_repo_tree_pages``, ``utils._pagination``) and the Hub's documented behaviour:

- ``GET /api/datasets/{org}/{name}/revision/{rev}`` -> ``{"id", "sha", ...}`` (DatasetInfo);
- ``GET /api/datasets/{org}/{name}/tree/{rev}[/{path}]?recursive=&expand=`` -> a JSON list of
  ``{"type": "file"|"directory", "path", "size", "oid", "lfs"}``, ``page_size`` entries per page,
  the next page in a ``Link: <...>; rel="next"`` header (the client follows it as given);
  ``path`` arrives percent-encoded (``/`` as ``%2F``, as the client sends it);
- ``GET /datasets/{org}/{name}/resolve/{rev}/{path}`` -> ``302`` to the storage host, which is a
  second server bound to 127.0.0.2 (another host, so a client's redirect rules apply), serving
  the bytes with ``Range`` and an ``ETag``; a gated file answers ``401`` without the right
  ``Authorization: Bearer`` token; ``throttle(path, n)`` makes the next ``n`` resolves answer
  ``429`` with ``Retry-After``.

Every request is recorded with its headers (``hub.requests`` / ``hub.storage_requests``) so tests
count API calls and check where a token went. Commits are content hashes of the tree.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from servers import _QuietServer, _ServerThread, parse_range

HF_HUB_VERSION = "2.4.0"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    # When it arrived (monotonic): tests check a retry came after the Retry-After it was given.
    at: float = field(default_factory=time.monotonic)


@dataclass
class Repo:
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)


class LocalHub:
    """``with LocalHub(token="hf_x") as hub: hub.push("org/name", {path: bytes})``;
    ``hub.endpoint`` is what ``HF_ENDPOINT`` should say."""

    def __init__(self, *, token: str = "hf_test_token_123", page_size: int = 1000, retry_after: int = 1):
        self.token = token
        self.page_size = page_size
        self.retry_after = retry_after
        # Send Retry-After as an HTTP-date (now + retry_after) instead of seconds, as CDNs do.
        self.retry_after_as_date = False
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.requests: list[Recorded] = []
        self.storage_requests: list[Recorded] = []
        self._throttled: dict[str, int] = {}
        self._lock = threading.Lock()
        self._api = _ServerThread(_QuietServer(("127.0.0.1", 0), _handler(self, storage=False)))
        self._storage = _ServerThread(_QuietServer(("127.0.0.2", 0), _handler(self, storage=True)))
        self.endpoint = f"http://127.0.0.1:{self._api.port}"
        self.storage = f"http://127.0.0.2:{self._storage.port}"

    def __enter__(self) -> LocalHub:
        self._api.start()
        self._storage.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._api.stop()
        self._storage.stop()

    def push(self, repo: str, files: dict[str, bytes], *, branch: str = "main", replace: bool = False) -> str:
        """A new commit on ``branch`` adding (or, with ``replace``, holding only) ``files``."""
        with self._lock:
            entry = self.repos.setdefault(repo, Repo())
            base = {} if replace or branch not in entry.branches else entry.commits[entry.branches[branch]]
            tree = {**base, **files}
            digest = hashlib.sha1(
                repr(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in tree.items())).encode()
            )
            sha = digest.hexdigest()
            entry.commits[sha] = tree
            entry.branches[branch] = sha
            for data in tree.values():
                self.blobs[hashlib.sha256(data).hexdigest()] = data
            return sha

    def gate(self, repo: str, path: str) -> None:
        self.repos[repo].gated.add(path)

    def throttle(self, path: str, times: int) -> None:
        with self._lock:
            self._throttled[path] = times

    def api_calls(self) -> list[str]:
        """The dataset API calls (huggingface_hub also fetches ``/api/agent-harnesses`` for its
        user agent, at most once a day: not ours, not counted)."""
        return [r.path for r in self.requests if r.path.startswith("/api/datasets/")]

    def commit_of(self, repo: str, rev: str) -> str | None:
        entry = self.repos.get(repo)
        if entry is None:
            return None
        return entry.branches.get(rev) or (rev if rev in entry.commits else None)

    def _take_throttle(self, path: str) -> bool:
        with self._lock:
            left = self._throttled.get(path, 0)
            if left:
                self._throttled[path] = left - 1
            return bool(left)


def _entries(tree: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{folder}/" if folder else ""
    files, dirs = [], set()
    for path in sorted(tree):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :]
        if "/" in rest and not recursive:
            dirs.add(prefix + rest.split("/", 1)[0])
            continue
        data = tree[path]
        sha256 = hashlib.sha256(data).hexdigest()
        files.append(
            {
                "type": "file",
                "path": path,
                "size": len(data),
                "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                "lfs": {"oid": sha256, "size": len(data), "pointerSize": 134},
            }
        )
    folders = [
        {"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()} for d in sorted(dirs)
    ]
    return folders + files


def _handler(hub: LocalHub, *, storage: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, value: Any, headers: dict[str, str] | None = None) -> None:
            self._send(
                200, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})}
            )

        def _error(self, status: int, message: str, code: str = "") -> None:
            headers = {"Content-Type": "application/json"}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            record = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            with hub._lock:
                (hub.storage_requests if storage else hub.requests).append(record)
            url = urllib.parse.urlsplit(self.path)
            if storage:
                return self._blob(url.path)
            parts = url.path.split("/")
            if url.path.startswith("/api/datasets/") and len(parts) >= 6:
                repo, route = f"{parts[3]}/{parts[4]}", parts[5]
                rev = urllib.parse.unquote(parts[6]) if len(parts) > 6 else ""
                sha = hub.commit_of(repo, rev)
                if sha is None:
                    code = "RepoNotFound" if repo not in hub.repos else "RevisionNotFound"
                    return self._error(404, f"{repo}@{rev} not found", code)
                if route == "revision":
                    files = [{"rfilename": p} for p in sorted(hub.repos[repo].commits[sha])]
                    return self._json({"id": repo, "sha": sha, "private": False, "siblings": files})
                if route == "tree":
                    folder = urllib.parse.unquote("/".join(parts[7:]))
                    return self._tree(repo, sha, folder, urllib.parse.parse_qs(url.query))
            if url.path.startswith("/datasets/") and len(parts) >= 7 and parts[4] == "resolve":
                repo = f"{parts[2]}/{parts[3]}"
                sha = hub.commit_of(repo, urllib.parse.unquote(parts[5]))
                path = urllib.parse.unquote("/".join(parts[6:]))
                tree = hub.repos[repo].commits[sha] if sha else {}
                if path not in tree:
                    return self._error(404, "Entry not found", "EntryNotFound")
                if (
                    path in hub.repos[repo].gated
                    and self.headers.get("Authorization") != f"Bearer {hub.token}"
                ):
                    return self._error(401, "Access to this file is restricted", "GatedRepo")
                if hub._take_throttle(path):
                    wait = str(hub.retry_after)
                    if hub.retry_after_as_date:
                        wait = email.utils.formatdate(time.time() + hub.retry_after, usegmt=True)
                    return self._send(429, b"Too Many Requests", {"Retry-After": wait})
                blob = hashlib.sha256(tree[path]).hexdigest()
                return self._send(
                    302, b"", {"Location": f"{hub.storage}/blobs/{blob}", "X-Linked-Etag": blob}
                )
            self._error(404, "no such route")

        def _tree(self, repo: str, sha: str, folder: str, query: dict[str, list[str]]) -> None:
            recursive = query.get("recursive", ["False"])[0].lower() == "true"
            entries = _entries(hub.repos[repo].commits[sha], folder, recursive)
            if folder and not entries:
                return self._error(404, f"{folder} not found", "EntryNotFound")
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start : start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                quoted = urllib.parse.quote(folder, safe="")
                next_url = (
                    f"{hub.endpoint}/api/datasets/{repo}/tree/{sha}{'/' + quoted if folder else ''}"
                    f"?recursive={recursive}&expand=False&cursor={start + hub.page_size}"
                )
                headers["Link"] = f'<{next_url}>; rel="next"'
            self._json(page, headers)

        def _blob(self, path: str) -> None:
            data = hub.blobs.get(path.rpartition("/")[2])
            if data is None:
                return self._error(404, "no such blob")
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            span = parse_range(self.headers.get("Range"), len(data))
            if span == "unsatisfiable":
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            if span is None:
                return self._send(200, data, {"ETag": etag, "Accept-Ranges": "bytes"})
            first, last = span
            headers = {"ETag": etag, "Content-Range": f"bytes {first}-{last}/{len(data)}"}
            self._send(206, data[first : last + 1], headers)

    return Handler
