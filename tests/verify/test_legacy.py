"""The legacy protocol reproduces the incident as shortest counterexamples."""
import pytest

from bulkhead.verify.scenarios import LEGACY_GOALS, legacy_search


@pytest.mark.parametrize("goal", sorted(LEGACY_GOALS))
def test_legacy_leaks_across_tenants(goal):
    found = legacy_search(goal).found()
    assert found is not None and found.kind == "cross_tenant_read"


def test_incident_trace_reads_a_page_the_stub_never_wrote():
    found = legacy_search("incident").found()
    assert any("PrefillFailed(r2)" in step for step in found.labels)
    assert found.labels[-1] == "decode0 runs r2's decode step"


def test_abort_trace_has_the_late_write_after_the_free():
    found = legacy_search("abort_during_transfer").found()
    victim = found.detail.split("holding r")[1][0]
    labels = list(found.labels)
    freed = next(i for i, l in enumerate(labels) if f"Finalize(r{victim} ABORTED) to decode0" in l)
    assert any(f"Landing(r{victim}" in l for l in labels[freed:])
