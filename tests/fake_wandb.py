"""FAKE W&B server on 127.0.0.1, answering exactly what ``wandb sync`` (the real client)
asks: ``UpsertBucket`` and ``CreateRunFiles`` over GraphQL, the run's file stream, and the
file uploads. It keeps what arrived, so a test can see which runs were synced, with which
key, and their history rows. In a thread of the test process (no process is started).
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class FakeWandb:
    api_key: str = field(default_factory=lambda: "fakewandb" + secrets.token_hex(16))
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Run name -> ``{"project", "history": [rows], "files": [names], "keys": {keys}}``."""
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        return {"WANDB_API_KEY": self.api_key, "WANDB_BASE_URL": self.url}

    def _run(self, name: str) -> dict[str, Any]:
        return self.runs.setdefault(name, {"history": [], "files": [], "keys": set()})

    def answer(self, method: str, path: str, body: bytes, auth: str) -> dict[str, Any]:
        key = base64.b64decode(auth.removeprefix("Basic ")).decode().split(":")[-1] if auth else ""
        if path.startswith("/graphql"):
            query = json.loads(body)
            text, variables = query.get("query", ""), query.get("variables", {})
            if "upsertBucket" in text:
                name = variables.get("name") or "run"
                run = self._run(name)
                run["project"] = variables.get("project")
                run["keys"].add(key)
                project = {"id": "UHJvamVjdDox", "name": run["project"] or "ups",
                           "entity": {"id": "RW50aXR5OjE=", "name": "e"}}  # fmt: skip
                bucket = {"id": "QnVja2V0OjE=", "name": name, "displayName": name,
                          "description": "", "config": "{}", "sweepName": None,
                          "project": project, "historyLineCount": 0}  # fmt: skip
                return {"data": {"upsertBucket": {"bucket": bucket, "inserted": True}}}
            if "createRunFiles" in text:
                files = variables["files"]
                self._run(variables["run"])["files"] += files
                urls = [{"name": f, "uploadUrl": f"{self.url}/upload/{f}"} for f in files]
                return {
                    "data": {
                        "createRunFiles": {"runID": "UnVuOjE=", "uploadHeaders": [], "files": urls}
                    }
                }
            return {"data": {}}
        if path.startswith("/files/") and path.endswith("/file_stream"):
            run = self._run(path.split("/")[4])
            run["keys"].add(key)
            stream = json.loads(body).get("files", {})
            for line in stream.get("wandb-history.jsonl", {}).get("content", []):
                run["history"].append(json.loads(line))
        return {}

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                auth = self.headers.get("authorization", "")
                out = json.dumps(fake.answer(self.command, self.path, body, auth)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_PUT = do_GET = do_POST

            def log_message(self, *args: object) -> None:
                pass  # a line per request otherwise

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def fake_wandb() -> Iterator[FakeWandb]:
    server = FakeWandb()
    server.start()
    try:
        yield server
    finally:
        server.stop()
