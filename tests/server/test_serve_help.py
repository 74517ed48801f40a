"""`bulkhead serve --help` a newcomer can read (issue 34 item 8; it was 51
flags in 244 lines, no groups, one help 30 lines long): at most 25 flags in
groups, every default shown, each help one to three lines at 80 columns,
and the developer and benchmark switches under --help-all, where every
flag the parser takes is listed and from where each still parses."""
import contextlib
import io
import re

import pytest

from bulkhead.cli import build_parser, main

GROUPS = ("model:", "deployment:", "tenants and limits:", "KV and isolation:", "operations:")
DEVELOPER = ("--fairness", "--no-interjection", "--unsafe-no-guards", "--worker-config", "--linear-kernel",
             "--decode-attention", "--prefill-attention", "--prefill-glue", "--decode-glue", "--no-safe-mode")


def _help(flag: str, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(["serve", flag])
    assert done.value.code == 0
    return out.getvalue()


def _options(text: str) -> dict[str, list[str]]:
    """{each flag's long name: the lines of its help} as printed."""
    options: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in text.splitlines():
        if re.match(r"^  -", line):
            invocation, *rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            lines = options.setdefault(re.findall(r"--[\w-]+", invocation)[-1], [])
            lines.extend(rest)
        elif line.startswith(" " * 24) and lines is not None:
            lines.append(line.strip())
        else:
            lines = None
    return options


def _serve_actions() -> list:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    return [a for a in serve._actions if a.option_strings]


@pytest.fixture
def plain(monkeypatch):
    return _help("--help", monkeypatch)


@pytest.fixture
def every(monkeypatch):
    return _help("--help-all", monkeypatch)


def test_plain_help_lists_at_most_25_flags_in_groups(plain):
    shown = _options(plain)
    assert len(shown) <= 25, sorted(shown)
    positions = [plain.index("\n" + title) for title in GROUPS]
    assert positions == sorted(positions), "groups out of order"
    assert not set(DEVELOPER) & set(shown)
    assert "bulkhead serve --help-all" in plain


def test_help_all_lists_every_flag_the_parser_takes(every):
    listed = _options(every)
    for action in _serve_actions():
        assert max(action.option_strings, key=len) in listed, action.option_strings
    assert "developer and benchmark switches:" in every and "split the cores split" not in every


def test_flags_hidden_from_plain_help_still_parse():
    args = build_parser().parse_args(["serve", "--fairness", "fcfs", "--no-interjection", "--unsafe-no-guards",
                                      "--worker-config", "{}", "--linear-kernel", "q4", "--decode-tile", "0"])
    assert (args.fairness, args.no_interjection, args.unsafe_no_guards) == ("fcfs", True, True)
    assert (args.worker_config, args.linear_kernel, args.decode_tile) == ("{}", "q4", 0)


def test_every_flag_shows_its_default_and_keeps_its_help_short(every):
    listed = _options(every)
    for action in _serve_actions():
        name = max(action.option_strings, key=len)
        text = " ".join(listed[name])
        assert 1 <= len(listed[name]) <= 3, (name, listed[name])
        if action.nargs == 0:  # a switch: off unless given
            continue
        assert "default" in text, (name, text)
        if action.default is not None:
            assert f"(default: {action.default}" in text, (name, text)
