"""A local stand-in for the Hugging Face Hub's HTTP API, for tests and screenshots: nothing leaves the machine.

It answers what huggingface_hub calls for search and download: GET /api/models (search), GET
/api/models/<repo>[/revision/<rev>] (model info; ?blobs=true adds sizes and LFS sha256), and
GET/HEAD /<repo>/resolve/<rev>/<file> with Range requests (206). Unknown repos and files answer 404 with the
Hub's X-Error-Code header. Faults a test asks for are real HTTP behaviour: `cut_after[file] = n` closes the
connection after n bytes of the body (an interrupted download), `corrupt` serves other bytes than the
published hash.

    python -m tools.peers.fake_hub --port 8765 FILE...   # serve files as repo local/demo-GGUF
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """repos: {repo_id: {file name: bytes}}. Start with start(); `url` is the endpoint for HF_ENDPOINT."""

    def __init__(self, repos: dict[str, dict[str, bytes]], tags: dict[str, list[str]] | None = None):
        self.repos = repos
        self.tags = tags or {}
        self.cut_after: dict[str, int] = {}  # file name -> close the connection after this many body bytes
        self.corrupt: set[str] = set()  # file names served with their last byte flipped
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "FakeHub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def repo_tags(self, repo_id: str) -> list[str]:
        if repo_id in self.tags:
            return self.tags[repo_id]
        names = self.repos[repo_id]
        return (["gguf"] if any(n.endswith(".gguf") for n in names) else []) + \
               (["safetensors"] if any(n.endswith(".safetensors") for n in names) else [])

    def info(self, repo_id: str, blobs: bool) -> dict:
        siblings = []
        for name, data in self.repos[repo_id].items():
            s = {"rfilename": name}
            if blobs:
                s["size"] = len(data)
                if name.endswith((".gguf", ".safetensors")):
                    s["blobId"] = hashlib.sha1(b"lfs pointer " + name.encode()).hexdigest()
                    s["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
                else:
                    s["blobId"] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            siblings.append(s)
        return {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "private": False, "downloads": 1000 + len(repo_id),
                "likes": 7, "tags": self.repo_tags(repo_id), "siblings": siblings}


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet in tests
            pass

        def _json(self, status: int, body, error_code: str | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if error_code:
                self.send_header("X-Error-Code", error_code)
                self.send_header("X-Error-Message", body.get("error", ""))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            url = urlparse(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            hub.authorizations.append(self.headers.get("Authorization"))
            if path == "/api/models":
                words = (query.get("search") or [""])[0].lower()
                hits = [hub.info(r, False) for r in hub.repos if words in r.lower()]
                hits.sort(key=lambda m: -m["downloads"])
                return self._json(200, hits[: int((query.get("limit") or [100])[0])])
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
            if m:
                if m.group(1) not in hub.repos:
                    return self._json(404, {"error": "Repository not found"}, "RepoNotFound")
                return self._json(200, hub.info(m.group(1), "blobs" in query))
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._file(m.group(1), m.group(3))
            return self._json(404, {"error": "Not found"})

        def _file(self, repo_id: str, name: str) -> None:
            files = hub.repos.get(repo_id)
            if files is None:
                return self._json(404, {"error": "Repository not found"}, "RepoNotFound")
            if name not in files:
                return self._json(404, {"error": "Entry not found"}, "EntryNotFound")
            data = files[name]
            if name in hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start, status = 0, 200
            rng = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if rng:
                start, status = int(rng.group(1)), 206
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            body = data[start:]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{hashlib.sha256(files[name]).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if self.command == "HEAD":
                return
            cut = hub.cut_after.pop(name, None)
            if cut is not None:  # once: the resumed request gets the rest
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--repo", default="local/demo-GGUF")
    args = ap.parse_args(argv)
    hub = FakeHub({args.repo: {f.name: f.read_bytes() for f in args.files}})
    hub.server.server_close()
    hub.server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(hub))
    print(f"HF_ENDPOINT=http://127.0.0.1:{args.port}", flush=True)
    hub.server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
