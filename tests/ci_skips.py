"""CI says what it skipped, and fails when a test this machine can run skipped.

Tests skip where a machine lacks what they need: a CPU feature the kernels
use, a C compiler, java (TLC), chromium (the dashboard's browser test),
Mooncake. On the project's machines all of that is there (`.ci/run` installs
the packages), so a skip there is a test that silently stopped running. With
BULKHEAD_CI=1 (set by `.ci/run`) every skip is listed with its reason, and the
run fails unless the skip names something this machine really lacks.
"""

from __future__ import annotations

import os
import shutil
from functools import cache

import pytest

# Words a skip reason uses for a need, and whether this machine meets it.
NEEDS = {
    "avx512_bf16": ("AVX-512 BF16",),
    "avx512_vnni": ("VNNI",),
    "avx512f": ("AVX-512", "4-bit kernel", "cannot run here", "cannot be built here"),
    "compiler": ("compiler", "cannot be built here", "does not build here"),
    "java": ("java", "TLC"),
    "chromium": ("chromium", "playwright"),
    "mooncake": ("mooncake", "libibverbs"),
}


@cache
def machine_has() -> frozenset[str]:
    """The needs in NEEDS that this machine meets."""
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = {word for line in f if line.startswith("flags") for word in line.split()}
    have = {need for need in ("avx512_bf16", "avx512_vnni", "avx512f") if need in flags}
    if shutil.which("cc") or shutil.which("gcc"):
        have.add("compiler")
    if shutil.which("java"):
        have.add("java")
    if shutil.which("chromium") or os.path.exists("/usr/bin/chromium"):
        have.add("chromium")
    from tests.disagg.mooncake_check import mooncake_unavailable

    if mooncake_unavailable() is None:
        have.add("mooncake")
    return frozenset(have)


def skip_allowed(reason: str, have: frozenset[str]) -> bool:
    """A skip is allowed when its reason names a need this machine lacks.

    On a machine that meets every need nothing may skip, whatever the reason
    says: that is the project's machine, where every test runs."""
    if have >= NEEDS.keys():
        return False
    lacking = NEEDS.keys() - have
    return any(word.lower() in reason.lower() for need in lacking for word in NEEDS[need])


class SkipReport:
    """Collects skips during the run; lists them and fails the run in CI."""

    def __init__(self) -> None:
        self.skips: list[tuple[str, str]] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skips.append((report.nodeid, reason))

    def refused(self) -> list[tuple[str, str]]:
        return [(node, reason) for node, reason in self.skips if not skip_allowed(reason, machine_has())]

    @pytest.hookimpl
    def pytest_sessionfinish(self, session) -> None:
        if self.refused() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        write(f"skipped: {len(self.skips)} (this machine has: {', '.join(sorted(machine_has())) or 'none of them'})")
        refused = set(self.refused())
        for node, reason in self.skips:
            write(f"  {'REFUSED' if (node, reason) in refused else 'allowed'} {node}: {reason}")
        if refused:
            write(f"{len(refused)} skipped test(s) can run on this machine: the run fails (BULKHEAD_CI=1)")


def pytest_configure(config) -> None:
    if os.environ.get("BULKHEAD_CI") == "1":
        config.pluginmanager.register(SkipReport(), "bulkhead_ci_skips")
