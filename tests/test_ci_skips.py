"""The rule that fails CI when a test this machine can run skipped."""

from tests.ci_skips import NEEDS, skip_allowed

EVERYTHING = frozenset(NEEDS)


def test_on_a_machine_with_everything_no_skip_is_allowed():
    assert not skip_allowed("java is not installed (TLC needs a JRE)", EVERYTHING)
    assert not skip_allowed("some reason nobody mapped", EVERYTHING)


def test_a_skip_is_allowed_when_it_names_what_the_machine_lacks():
    assert skip_allowed("java is not installed (TLC needs a JRE)", EVERYTHING - {"java"})
    assert skip_allowed("no AVX-512 BF16 here: a bf16 checkpoint runs exact", EVERYTHING - {"avx512_bf16"})


def test_a_skip_naming_something_the_machine_has_is_refused():
    assert not skip_allowed("no chromium (Debian package 'chromium')", EVERYTHING - {"java"})
    assert not skip_allowed("some reason nobody mapped", EVERYTHING - {"java"})
