"""A small Hugging Face Hub on 127.0.0.1 for push/pull tests, so no test ever contacts the real hub.

It implements only what ``huggingface_hub`` 2.4's client calls for ``push_to_hub`` and ``from_pretrained``
(endpoints read from ``hf_api.py``, ``_commit_api.py`` and ``file_download.py``):

=======================================================  =========================================
``POST /api/repos/create``                               create a model repo (409 if it exists)
``POST /api/validate-yaml``                              README metadata check (always valid)
``GET  /api/models/{repo}[/revision/{rev}]``             ``model_info`` / ``repo_info``
``POST /api/models/{repo}/preupload/{rev}``              upload mode: always ``"regular"``, so files
                                                         travel inline (base64) in the commit
``POST /api/models/{repo}/commit/{rev}``                 the NDJSON commit: header + ``file`` /
                                                         ``deletedFile`` / ``deletedFolder`` lines
``HEAD|GET /{repo}/resolve/{rev}/{path}``                file metadata (``ETag``, ``X-Repo-Commit``,
                                                         ``Content-Length``) and content
=======================================================  =========================================

Errors carry the ``X-Error-Code`` header the client maps to exceptions (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``). Not covered: authentication (any token is accepted), LFS and Xet
transfers (``lfsFile`` commit lines are refused), branches other than ``main``, pull requests, redirects.
Every request is recorded in ``LocalHub.requests`` so tests can see what the client did; a commit upload can
be made to fail halfway (``LocalHub.commits_to_drop``: the server reads half the body and hangs up).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

DEFAULT_NAMESPACE = "user"  # the owner of repos created without one (the real hub uses the token's user)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file, which is what the hub sends as a regular file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """A model repo: every commit's full file tree, and ``main`` pointing at the latest."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    main: str = ""

    def __post_init__(self):
        self.main = hashlib.sha1(b"initial commit").hexdigest()
        self.commits[self.main] = {".gitattributes": b""}

    def tree(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        sha = self.main if revision == "main" else revision
        return (sha, self.commits[sha]) if sha in self.commits else None


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub  # set on the subclass LocalHub builds

    # ---- plumbing -------------------------------------------------------------------------------------
    def log_message(self, format, *args):  # keep pytest output clean; requests are recorded instead
        pass

    @property
    def endpoint(self) -> str:
        return f"http://{self.headers['Host']}"

    def _send(
        self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"
    ):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict, headers: dict | None = None):
        self._send(status, json.dumps(payload).encode(), headers)

    def _error(self, status: int, code: str, message: str, headers: dict | None = None):
        self._json(
            status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})}
        )

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _route(self):
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path))
        with self.hub.lock:
            for method, pattern, handler in _ROUTES:
                match = re.fullmatch(pattern, path)
                if match and self.command in method:
                    return handler(self, *match.groups())
        self._error(404, "NotImplemented", f"{self.command} {path} is not implemented by the local test hub")

    do_GET = do_HEAD = do_POST = _route

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        return repo

    # ---- endpoints ------------------------------------------------------------------------------------
    def create_repo(self):
        payload = json.loads(self._body())
        repo_id = f"{payload.get('organization') or DEFAULT_NAMESPACE}/{payload['name']}"
        url = {"url": f"{self.endpoint}/{repo_id}"}
        if repo_id in self.hub.repos:
            return self._json(409, {"error": "You already created this model repo", **url})
        self.hub.repos[repo_id] = Repo()
        self._json(200, {**url, "name": repo_id})

    def validate_yaml(self):
        self._body()
        self._json(200, {"errors": [], "warnings": []})

    def model_info(self, repo_id: str, revision: str | None):
        if (repo := self._repo(repo_id)) is None:
            return
        if (found := repo.tree(revision or "main")) is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        sha, files = found
        siblings = [{"rfilename": name, "size": len(data)} for name, data in sorted(files.items())]
        self._json(
            200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "siblings": siblings}
        )

    def preupload(self, repo_id: str, revision: str):
        if self._repo(repo_id) is None:
            return
        files = json.loads(self._body())["files"]
        # "regular" makes the client send each file base64-encoded inside the commit itself (no LFS/Xet).
        modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
        self._json(200, {"files": modes})

    def commit(self, repo_id: str, revision: str):
        if (repo := self._repo(repo_id)) is None:
            return
        if revision != "main":
            return self._error(400, "InvalidRevision", "The local test hub only commits to main")
        if self.hub.commits_to_drop > 0:  # the connection dies mid-upload: nothing is committed
            self.hub.commits_to_drop -= 1
            self.rfile.read(int(self.headers.get("Content-Length") or 0) // 2)
            self.close_connection = True
            return None
        files = dict(repo.commits[repo.main])
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {name: data for name, data in files.items() if not name.startswith(prefix)}
            elif key != "header":
                return self._error(
                    400, "NotImplemented", f"Commit operation {key!r} (LFS/Xet) is not supported"
                )
        tree_id = "".join(f"{name}\0{git_blob_sha1(data)}\n" for name, data in sorted(files.items()))
        sha = hashlib.sha1(f"{repo.main}\n{tree_id}\n{len(repo.commits)}".encode()).hexdigest()
        repo.commits[sha], repo.main = files, sha
        self.hub.commits.append((repo_id, sha, sorted(files)))
        self._json(
            200, {"success": True, "commitOid": sha, "commitUrl": f"{self.endpoint}/{repo_id}/commit/{sha}"}
        )

    def resolve(self, repo_id: str, revision: str, filename: str):
        if (repo := self._repo(repo_id)) is None:
            return
        if (found := repo.tree(revision)) is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        sha, files = found
        if filename not in files:
            # The commit header lets the client cache the file's absence for this commit.
            return self._error(404, "EntryNotFound", f"{filename} does not exist", {"X-Repo-Commit": sha})
        data = files[filename]
        headers = {"ETag": f'"{git_blob_sha1(data)}"', "X-Repo-Commit": sha}
        self._send(200, data, headers, content_type="application/octet-stream")


_REPO = r"([^/]+/[^/]+)"
_ROUTES = [
    ("POST", r"/api/repos/create", _Handler.create_repo),
    ("POST", r"/api/validate-yaml", _Handler.validate_yaml),
    ("GET", rf"/api/models/{_REPO}(?:/revision/([^/]+))?", _Handler.model_info),
    ("POST", rf"/api/models/{_REPO}/preupload/([^/]+)", _Handler.preupload),
    ("POST", rf"/api/models/{_REPO}/commit/([^/]+)", _Handler.commit),
    (("GET", "HEAD"), rf"/{_REPO}/resolve/([^/]+)/(.+)", _Handler.resolve),
]


class LocalHub:
    """The hub server, run in a daemon thread on a free port of 127.0.0.1.

    Example:
        >>> with LocalHub() as hub:
        ...     env = hub.client_env(tmp_path)  # for a subprocess that imports huggingface_hub afterwards
    """

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.commits: list[tuple[str, str, list[str]]] = []  # (repo_id, sha, files after the commit)
        # Faults: the next this many commit uploads lose their connection halfway through the body.
        self.commits_to_drop = 0
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def client_env(self, hf_home) -> dict[str, str]:
        """Environment for a client process: read by huggingface_hub at import time, so set it before."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_TOKEN": "hf_local_test_token",  # any token: the local hub does not authenticate
            "HF_HOME": str(hf_home),
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
