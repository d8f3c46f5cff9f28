"""Libraries' Python logging never reaches a person's console raw.

An SSH endpoint that accepts the TCP connection and never speaks (Vast's proxy does this
while the container boots) makes paramiko's transport thread log "Error reading SSH
protocol banner" with a traceback at ERROR. `ups status` against such a port (a loopback
socket server in this test) must show ups's own one-paragraph error only, while the JSON
command log holds paramiko's record; `--verbose` shows it on stderr too.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy_fixtures import VENV_BIN


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def _status(tmp_path: Path, port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({
        "known_hosts": str(tmp_path / "known_hosts"),
        "hosts": {"booting": {"host": "127.0.0.1", "port": port, "user": "root",
                              "connect_timeout": 1}},
    }))  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UPS_STATE_DIR": str(tmp_path / "st")}
    return subprocess.run(
        [str(VENV_BIN / "ups"), "status", "--host", "booting", "--hosts-file", str(hosts), *extra],
        env=env, text=True, capture_output=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.ssh
def test_paramiko_traceback_goes_to_the_json_log_not_the_console(
    silent_port: int, tmp_path: Path
) -> None:
    """No traceback on stderr, exit 3 with ups's message; the JSON log has paramiko's
    record (logger, level, the banner error); with --verbose stderr shows the record."""
    result = _status(tmp_path, silent_port)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "paramiko" not in result.stderr, result.stderr
    assert "error: host 'booting' is unreachable" in result.stderr
    lines = (tmp_path / "st" / "logs" / "commands.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # strict JSON, every line
    banner = [
        r
        for r in records
        if r["event"] == "library_log" and "Error reading SSH protocol banner" in r["message"]
    ]
    assert banner and banner[0]["logger"] == "paramiko.transport", lines[-20:]
    assert banner[0]["level"] == "error"
    assert any(r["message"].startswith("Traceback") for r in records if "message" in r)

    verbose = _status(tmp_path, silent_port, "--verbose")
    assert verbose.returncode == 3
    assert "Error reading SSH protocol banner" in verbose.stderr
    assert "paramiko.transport" in verbose.stderr
