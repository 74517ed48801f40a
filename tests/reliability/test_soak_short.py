"""A short soak against the real disaggregated server: every injected kind happens,
and nothing crosses tenants, leaks pages or fails closed."""

import pytest

from bench.soak import render, run_soak

pytestmark = pytest.mark.e2e
DURATION_S = 20


def test_short_soak_serves_every_kind_and_loses_nothing(soak_server, soak_keys):
    report = run_soak(soak_server, soak_keys, DURATION_S, concurrency=8, role="local")
    table = render(report)
    # The must-be-zero figures: canary hits, over-length served, steps failed closed, pages leaked, memory growth.
    assert report.failures == [], table
    assert report.errors == {}, table
    assert report.tenants == 8
    assert report.requests_served > 0, table
    # Each injected kind really happened (the first requests go through every kind once) ...
    assert report.rejections.get("context_length_exceeded", 0) > 0, table
    assert report.disconnects > 0 and report.cancels > 0, table
    # Structured outputs and forced tool calls were served and well-formed (a malformed one is an error above).
    assert report.served_by_kind.get("json_schema", 0) > 0 and report.served_by_kind.get("tool_call", 0) > 0, table
    # ... and the server saw the clients leave, so their aborts were exercised.
    assert report.server_disconnects_seen > 0, table
    # The canary check can see canaries: some responses repeated their own.
    assert report.canary_echoes > 0, table
