"""The `bulkhead` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _convert(args: argparse.Namespace) -> int:
    import logging

    from bulkhead.model.gguf_import import bundled_gguf_path, convert_gguf

    logging.basicConfig(level="INFO")
    print(convert_gguf(args.gguf or bundled_gguf_path(), args.out))
    return 0


def build_parser(serve_arguments: bool = True) -> argparse.ArgumentParser:
    """serve_arguments=False leaves `serve`'s flags out: building them loads
    the kernel modules and torch (seconds), so main() builds them only for `serve`."""
    parser = argparse.ArgumentParser(prog="bulkhead", description="Multi-tenant LLM inference server that cannot "
                                     "hand one tenant's KV cache to another.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server", description="Start the "
                           "OpenAI-compatible server. Example: bulkhead serve --api-keys ~/bulkhead/keys.toml")
    if serve_arguments:
        from bulkhead.server.serve_flags import add_serve_arguments

        add_serve_arguments(serve)
    convert = sub.add_parser("convert", help="import a GGUF checkpoint as a Hugging Face safetensors directory",
                             description="Example: bulkhead convert model.gguf ./model-hf "
                                         "(no GGUF: the bundled SmolLM2)")
    convert.add_argument("gguf", type=Path, nargs="?", default=None)
    convert.add_argument("out", type=Path)
    from bulkhead.admin.cli import add_subcommand as add_admin
    from bulkhead.audit.cli import add_subcommands as add_audit
    from bulkhead.lineage.cli import add_subcommand as add_lineage
    from bulkhead.sim.cli import add_subcommand as add_sim
    from bulkhead.verify.cli import add_subcommand as add_verify

    # plan, preflight, probe; verify; sim; admin; lineage: each sets args.func
    for add in (add_audit, add_verify, add_sim, add_admin, add_lineage):
        add(sub)
    return parser


def main(argv: list[str] | None = None, seams=None) -> int:
    """seams: test harnesses only (bulkhead/seams.py); the command line never sets it."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(serve_arguments=command in (None, "serve"))
    args = parser.parse_args(argv)
    if args.command == "serve":
        from bulkhead.launch.serve import serve
        from bulkhead.seams import PRODUCTION
        from bulkhead.server.serve_flags import check_precision_flags

        if (problem := check_precision_flags(args)) is not None:
            parser.error(problem)  # a usage error: exit status 2, before any model loads
        return serve(args, seams or PRODUCTION)
    if args.command == "convert":
        return _convert(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
