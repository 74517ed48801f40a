"""Test faults live in tests/, not in the code that serves: the package
exposes seams (bulkhead/seams.py) and the fault matrix wraps them
(tests/faults/harness.py). A fault name or the incident's admission path
appearing in bulkhead/ means a back door a configuration could open."""

from pathlib import Path

from tests.faults.harness import ENV, KNOWN

PACKAGE = Path(__file__).resolve().parent.parent / "bulkhead"
# The incident's runtime path (tests/faults/legacy.py). The model checker's
# LEGACY protocol variant (bulkhead/verify) is a model, not a serving path.
LEGACY_PATH = ("LegacyTicket", "add_stub", "stub_ticket", "legacy_admission")


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_no_fault_name_or_fault_switch_in_the_package():
    names = (*KNOWN, ENV, "faults.fire", "faults.crash")
    found = sorted((path, name) for path, text in _sources().items() for name in names if name in text)
    assert found == [], found


def test_no_legacy_admission_path_in_the_package():
    found = sorted((path, name) for path, text in _sources().items() for name in LEGACY_PATH if name in text)
    assert found == [], found


def test_the_check_would_see_a_fault_name():
    # The grep must be able to fail: the harness's own source names them.
    harness = (Path(__file__).parent / "faults" / "harness.py").read_text()
    assert all(name in harness for name in ("corrupt_page", "no_scrub", "legacy_admission", ENV))
