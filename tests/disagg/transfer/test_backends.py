"""Each backend between two real processes: prefill here, decode in a spawned peer."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.disagg.mooncake_check import mooncake_unavailable
from tests.disagg.transfer import scenario

REPO = Path(__file__).resolve().parents[3]
IN_PROCESS = ["shm", "tcp"]


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_pages_arrive_exactly_and_nothing_else_changes(backend):
    scenario.check_copy(backend)


def test_tcp_guard_refuses_stale_generation():
    scenario.check_guard_refusal("tcp")


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_dead_decode_raises_instead_of_hanging(backend):
    scenario.check_dead_peer(backend)


@functools.cache
def _mooncake_skip_reason() -> str | None:
    if why := mooncake_unavailable():
        return why
    netns = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    if netns.returncode != 0:
        return f"cannot make a private network namespace (unshare -n needs root): {netns.stderr.strip()}"
    return None


@pytest.mark.parametrize("name", ["copy", "dead_peer"])
def test_mooncake_in_private_network_namespace(name):
    """Mooncake binds every interface whatever it is asked, so the whole
    scenario, both processes, runs in a namespace with only loopback."""
    reason = _mooncake_skip_reason()
    if reason:
        pytest.skip(reason)
    cmd = f"ip link set lo up; exec {sys.executable} -m tests.disagg.transfer.scenario mooncake {name}"
    env = {**os.environ, "GLOG_minloglevel": "2"}  # Mooncake's INFO logging drowns the failure output
    out = subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and f"SCENARIO OK mooncake {name}" in out.stdout, out.stdout + out.stderr[-4000:]
