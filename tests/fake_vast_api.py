"""The HTTP side of the FAKE Vast API (:mod:`tests.fake_vast`): exactly the paths the real
``vastai`` SDK calls, the offers it searches and the search query's operators.

Paths (from vastai 1.9 ``vastai/api``): POST /api/v0/bundles/ (search offers), PUT
/api/v0/asks/{offer}/ (create), GET /api/v0/instances/{id}/ (show), GET /api/v1/instances/
(list, paginated), PUT /api/v0/instances/{id}/ (stop/start/label), DELETE
/api/v0/instances/{id}/ (destroy), PUT /api/v0/instances/request_logs/{id}/ (logs).
"""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

if TYPE_CHECKING:
    from tests.fake_vast import FakeVast

OFFER_FIELDS = {
    "id", "gpu_name", "num_gpus", "reliability", "dph_total", "min_bid", "inet_down",
    "disk_space", "verified", "external", "rentable", "rented", "geolocation", "cuda_max_good",
    "machine_id", "host_id",
}  # fmt: skip


def default_offers() -> list[dict[str, Any]]:
    base = {"verified": True, "external": False, "rentable": True, "rented": False}
    rows = [
        (101, "RTX 4090", 2, 0.995, 0.80, 0.30, "Norway, NO"),
        (102, "RTX 4090", 2, 0.990, 0.62, 0.25, "Canada, CA"),
        (103, "RTX 3090", 1, 0.980, 0.21, 0.08, "Texas, US"),
        (104, "H100 SXM", 8, 0.999, 18.5, 9.0, "Iowa, US"),
    ]
    return [
        {**base, "id": i, "gpu_name": g, "num_gpus": n, "reliability": r, "dph_base": p,
         "min_bid": b, "geolocation": geo, "inet_down": 900.0, "disk_space": 200.0,
         "cuda_max_good": 12.8, "storage_cost": 0.15, "machine_id": i * 10,
         "host_id": i * 100}
        for i, g, n, r, p, b, geo in rows
    ]  # fmt: skip


def matches(value: Any, cond: dict[str, Any]) -> bool:
    return all(holds(value, op, want) for op, want in cond.items())


def holds(value: Any, op: str, want: Any) -> bool:
    if isinstance(want, str) and isinstance(value, int | float):
        want = float(want)
    if op in ("eq", "neq"):
        return (value == want) == (op == "eq")
    if op in ("in", "notin"):
        return (value in want) == (op == "in")
    if value is None or op not in ("gt", "gte", "lt", "lte"):
        return False
    return {"gt": value > want, "gte": value >= want, "lt": value < want, "lte": value <= want}[op]


def handler(fake: FakeVast) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def _reply(self, status: int, body: Any) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            path = url.path
            with fake.lock:
                fake.requests.append((method, path))
                if path.startswith("/fake-logs/"):
                    inst = fake.instances.get(int(path.rsplit("/", 1)[1]))
                    log = inst.root / "onstart.log" if inst else None
                    text = log.read_text() if log and log.exists() else ""
                    return self._reply(200, text)
                if fake.switches.rate_limit_next > 0:
                    fake.switches.rate_limit_next -= 1
                    return self._reply(429, {"success": False, "error": "rate_limited",
                                             "msg": "API requests too frequent"})  # fmt: skip
            key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            denied = fake.authorize(key, method, path)
            if denied:
                status = fake.switches.auth_error_status  # Vast answers 404 on some paths
                return self._reply(status, {"success": False, "error": "auth_error", "msg": denied})
            status, body = self._route(method, path, parse_qs(url.query))
            self._reply(status, body)

        def _route(self, method: str, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
            m = re.fullmatch(r"/api/v0/(?:instances/)?(\w+)/(\d+)/", path)
            kind, num = (m.group(1), int(m.group(2))) if m else (None, 0)
            if method == "POST" and path == "/api/v0/bundles/":
                return fake.search(self._body())
            if method == "PUT" and kind == "asks":
                return fake.create(num, self._body())
            if method == "GET" and path == "/api/v1/instances/":
                with fake.lock:
                    rows = [i.row() for i in fake.instances.values()]
                return 200, {"instances": rows, "next_token": None, "total_instances": len(rows)}
            if kind == "request_logs" and method == "PUT":
                return 200, {"result_url": f"{fake.url}/fake-logs/{num}"}
            m = re.fullmatch(r"/api/v0/instances/(\d+)/", path)
            inst = fake.instances.get(int(m.group(1))) if m else None
            if m and method == "GET":
                return 200, {"instances": inst.row() if inst else None}
            if inst is None:
                return 404, {"success": False, "error": "no_such_instance", "msg": "not found"}
            if method == "PUT":
                return 200, fake.set_state(inst, self._body())
            if method == "DELETE":
                if fake.host_faults.destroy_fails > 0:
                    fake.host_faults.destroy_fails -= 1
                    return 500, {"success": False, "error": "server_error", "msg": "try again"}
                fake.destroy(inst.id)
                return 200, {"success": True, "msg": "destroying instance"}
            return 404, {"success": False, "error": "not_found", "msg": path}

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler
