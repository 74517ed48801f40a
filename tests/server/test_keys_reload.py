"""A keys.toml with a mistake, or gone for a moment, never costs a request a 5xx
and never changes who may ask: the last good keys stay in force, and the
operator sees why in /server_info and /metrics (issue 16 item 2)."""

import os
import time

import httpx

from tests.server.tiny_server import ALPHA, BETA
from tests.server_process import OPERATOR_HEADERS


def touch_later(path, seconds: int) -> None:
    later = time.time_ns() + seconds * 10**9
    os.utime(path, ns=(later, later))  # a new mtime even on a coarse clock


def until(predicate, what: str):
    """Poll (the key store stats the file at most once a second), bounded by a count, not a time."""
    for _ in range(100):
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def served(server, key: str) -> int:
    return httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}).status_code


def test_a_typo_keeps_the_last_good_keys_names_the_line_and_shows_in_server_info_and_metrics(tiny_server):
    keys_file = tiny_server.log_path.parent / "keys.toml"
    good = keys_file.read_text()
    failures = tiny_server.metric("bulkhead_keys_reload_failures_total")
    try:
        # The typo also drops beta's line: a revocation written with a typo does not happen, and says so.
        keys_file.write_text(f'[keys]\n"{ALPHA}" = "alpha\n')
        touch_later(keys_file, 2)
        error = until(lambda: tiny_server.info()["tenants"]["reload_error"], "the typo shows in /server_info")
        assert "line 2" in error and "not valid TOML" in error
        for _ in range(3):  # across several once-a-second checks: never a 5xx, and beta is still served
            assert served(tiny_server, ALPHA) == 200 and served(tiny_server, BETA) == 200
            time.sleep(0.4)
        assert tiny_server.metric("bulkhead_keys_file_valid") == 0
        assert tiny_server.metric("bulkhead_keys_reload_failures_total") == failures + 1  # logged once
        assert tiny_server.log().count("keys file not reloaded") == failures + 1
    finally:
        keys_file.write_text(good)
        touch_later(keys_file, 4)
    until(lambda: tiny_server.info()["tenants"]["reload_error"] is None, "the fixed file is read")
    assert tiny_server.metric("bulkhead_keys_file_valid") == 1


def test_a_file_gone_for_a_moment_revokes_no_one(tiny_server):
    keys_file = tiny_server.log_path.parent / "keys.toml"
    good = keys_file.read_bytes()
    stat = keys_file.stat()
    keys_file.unlink()  # an editor replacing the file: gone, then back
    try:
        until(lambda: tiny_server.info()["tenants"]["reload_error"], "the missing file shows in /server_info")
        assert served(tiny_server, ALPHA) == 200
        assert httpx.get(tiny_server.url + "/metrics", headers=OPERATOR_HEADERS).status_code == 200
    finally:
        keys_file.write_bytes(good)
        os.utime(keys_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same file, the same mtime
    until(lambda: tiny_server.info()["tenants"]["reload_error"] is None, "the file is back")
    assert served(tiny_server, BETA) == 200
