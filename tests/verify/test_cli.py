from bulkhead.cli import main
from bulkhead.verify import cli


def test_legacy_cli_prints_traces_and_stats(capsys):
    assert main(["verify", "--protocol", "legacy", "--stats"]) == 0
    out = capsys.readouterr().out
    assert "cross_tenant_read" in out and "legacy:incident" in out and "transitions" in out


def test_add_subcommand_wires_into_argparse():
    import argparse
    parser = argparse.ArgumentParser()
    cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["verify", "--protocol", "real", "--bound", "small", "--stats"])
    assert args.func is cli.run and args.bound == "small"
