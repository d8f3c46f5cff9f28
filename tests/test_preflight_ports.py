"""Ports check and the port helpers that `ups launch` imports."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from tests.fixtures.preflight_helpers import run_check
from ups.preflight import Status
from ups.preflight.checks.ports import is_bindable, pick_free_port, port_holder


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port held by a real listening socket in this process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_free_master_port_passes() -> None:
    """A free master port passes and is reported as the check's value."""
    port = pick_free_port(0)
    result = run_check("ports", master_port=port)
    assert result.status is Status.PASS
    assert result.value == port
    assert f"master port {port} is free" in result.message


def test_held_master_port_fails_naming_the_holder(held_port: int) -> None:
    """A port held by a listening socket fails, names the pid holding it and suggests a free one."""
    result = run_check("ports", master_port=held_port)
    assert result.status is Status.FAIL
    assert f"pid {os.getpid()}" in result.message
    suggested = result.details["master"]["suggested"]
    assert suggested != held_port and is_bindable(suggested)
    assert result.hint is not None
    assert f"--master-port {suggested}" in result.hint
    assert f"kill {os.getpid()}" in result.hint


def test_held_rdzv_port_fails_even_when_master_is_free(held_port: int) -> None:
    """The rendezvous port is checked too when one is given."""
    result = run_check("ports", master_port=pick_free_port(0), rdzv_port=held_port)
    assert result.status is Status.FAIL
    assert f"rendezvous port {held_port} is taken" in result.message


def test_launcher_fallback_turns_a_held_port_into_a_warning(held_port: int) -> None:
    """When the launcher picks a free port itself, a taken port is a warning naming the new one."""
    result = run_check("ports", master_port=held_port, port_fallback=True)
    assert result.status is Status.WARN
    assert f"using {result.details['master']['suggested']}" in result.message


def test_port_helpers(held_port: int) -> None:
    """is_bindable/pick_free_port/port_holder agree with a real held socket."""
    assert not is_bindable(held_port)
    other = pick_free_port(held_port)
    assert other != held_port and is_bindable(other)
    assert pick_free_port(other) == other
    holder = port_holder(held_port)
    assert holder is not None and holder.startswith(f"pid {os.getpid()} ")
    assert port_holder(other) is None
