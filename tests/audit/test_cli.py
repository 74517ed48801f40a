"""The argparse surface the lead wires into `bulkhead`."""

import argparse

import pytest

from bulkhead.audit.cli import add_subcommands
from bulkhead.cli import main


def test_subcommands_attach_to_a_foreign_parser():
    parser = argparse.ArgumentParser(prog="bulkhead")
    subparsers = parser.add_subparsers(dest="command")
    parser_serve = subparsers.add_parser("serve")  # the lead's own commands live alongside
    add_subcommands(subparsers)
    args = parser.parse_args(["preflight", "http://127.0.0.1:1", "--json"])
    assert callable(args.func) and args.urls == ["http://127.0.0.1:1"] and args.json
    assert parser_serve is not None


@pytest.mark.parametrize("command", ["plan", "preflight"])
def test_help_includes_an_example(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and f"bulkhead {command}" in out and "exit codes" in out


def test_missing_required_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", "x.json"])
    assert exited.value.code == 2
