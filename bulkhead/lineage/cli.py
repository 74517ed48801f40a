"""`bulkhead lineage verify | who-read | request`: read a page-lineage log.

Every command takes the name given to `serve --lineage-log` (or any log's
own PATH) and the lineage key. A name stands for its own log and every
worker's log beside it (lineage.jsonl -> lineage.prefill-0.jsonl,
lineage.decode-0.jsonl: chain.logs_named), each with its rotated segments
PATH.1, PATH.2, ... who-read and request verify each log first and refuse
to answer from one whose chain is broken (exit 1) unless --no-verify;
verify's exit codes are in verify.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from bulkhead.lineage import chain
from bulkhead.lineage.query import request_story, requests_named, who_read
from bulkhead.lineage.verify import EXIT_FOREIGN, EXIT_GAP, EXIT_OK, EXIT_TAMPERED, EXIT_USAGE, verify


def add_subcommand(sub) -> None:
    p = sub.add_parser("lineage", help="verify and query a forensic page-lineage log",
                       description="Example: bulkhead lineage who-read --tenant acme --key lineage.key lineage.jsonl "
                                   "(the name given to serve --lineage-log finds every worker's log beside it)")
    cmds = p.add_subparsers(dest="lineage_command", required=True)
    v = cmds.add_parser("verify", help="check the hash chain: exit 0 whole, 1 changed/removed/reordered/truncated, "
                                       "2 no log or key, 3 foreign log or other key, 4 writer recorded a gap")
    w = cmds.add_parser("who-read", help="every request handed a page while it held a tenant's KV")
    w.add_argument("--tenant", required=True)
    w.add_argument("--since", default=None, help="ISO 8601 time or unix seconds: only reads from then on")
    w.add_argument("--include-own", action="store_true", help="also the tenant's own requests")
    w.add_argument("--include-scrubbed", action="store_true",
                   help="also requests handed a page that had held the tenant's KV but was scrubbed since")
    r = cmds.add_parser("request", help="the pages a request was handed, and each page's history")
    r.add_argument("request_id", help="the response id (cmpl-..., chatcmpl-...), or the X-Request-Id the client sent")
    r.add_argument("--tenant", default=None, help="with an X-Request-Id: the client's tenant (ids are per tenant)")
    for c in (v, w, r):
        c.add_argument("logs", nargs="+", type=Path, metavar="LOG",
                       help="the name given to --lineage-log (its workers' logs are found beside it), or a log")
        c.add_argument("--key", type=Path, required=True, help="the lineage key file (serve's --lineage-key)")
        if c is not v:
            c.add_argument("--json", action="store_true", help="JSON instead of text")
            c.add_argument("--no-verify", action="store_true", help="answer even from a log whose chain is broken")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        key = chain.load_key(args.key)
    except chain.LineageKeyError as e:
        print(f"bulkhead lineage: {e}", file=sys.stderr)
        return EXIT_USAGE
    missing = [p for p in args.logs if not chain.logs_named(p)]
    if missing:
        print(f"bulkhead lineage: no lineage log at {', '.join(map(str, missing))}, nor a worker's log beside it "
              f"(such as {chain.worker_log_path(missing[0], 'prefill-0').name})", file=sys.stderr)
        return EXIT_USAGE
    logs = list(dict.fromkeys(log for p in args.logs for log in chain.logs_named(p)))
    if args.lineage_command == "verify":
        return _verify(logs, key)
    if not args.no_verify:
        worst = max((verify(p, key).exit_code for p in logs), key=_severity)
        if worst not in (EXIT_OK, EXIT_GAP):
            print("bulkhead lineage: refusing to answer from a log that does not verify (run `bulkhead lineage "
                  "verify`, or pass --no-verify)", file=sys.stderr)
            return worst
    if args.lineage_command == "who-read":
        return _who_read(args, logs)
    return _request(args, logs)


def _verify(logs: list[Path], key: bytes) -> int:
    worst = EXIT_OK
    for path in logs:
        report = verify(path, key)
        code = report.exit_code
        print(f"{path}: {_VERDICTS[code]}: {report.records} records in {report.segments} segments")
        if report.foreign:
            print(f"  {report.foreign}")
        for p in report.problems:
            print(f"  problem: {p}")
        for n in report.notes:
            print(f"  note: {n}")
        worst = max(worst, code, key=_severity)
    return worst


def _who_read(args: argparse.Namespace, logs: list[Path]) -> int:
    try:
        since = _parse_time(args.since)
    except ValueError as e:
        print(f"bulkhead lineage: --since {args.since!r}: {e}", file=sys.stderr)
        return EXIT_USAGE
    reads = who_read(logs, args.tenant, since, args.include_own, args.include_scrubbed)
    if args.json:
        print(json.dumps([asdict(r) for r in reads], indent=1))
        return EXIT_OK
    print(f"{len(reads)} reads of tenant {args.tenant}'s KV")
    for r in reads:
        print(f"  {_when(r.ts)} {r.log} #{r.seq}: request {r.request} (tenant {r.tenant}) was handed page "
              f"{r.page} gen {r.generation} by {r.via}; it held {args.tenant}'s KV from request "
              f"{r.held_by_request} gen {r.held_at_generation}; "
              f"{'scrubbed since' if r.scrubbed else 'NOT scrubbed since'}")
    return EXIT_OK


def _request(args: argparse.Namespace, logs: list[Path]) -> int:
    """A response id names its request directly; otherwise the id is taken
    as the X-Request-Id a client sent, which the log's `name` records map."""
    request, client_id = args.request_id, None
    story = request_story(logs, request)
    if not story.records:
        named = requests_named(logs, request, args.tenant)
        if len(named) > 1:
            print(f"bulkhead lineage: X-Request-Id {request!r} names {len(named)} requests (an id is unique only "
                  f"within a tenant, while in flight): "
                  + "; ".join(f"{n.request} (tenant {n.tenant}, {_when(n.ts)})" for n in named)
                  + ". Give one of these ids" + ("" if args.tenant else ", or --tenant"), file=sys.stderr)
            return EXIT_USAGE
        if named:
            client_id, story = request, request_story(logs, named[0].request)
    if not story.records:
        print(f"bulkhead lineage: no request {request!r} (a response id or an X-Request-Id"
              f"{' of tenant ' + args.tenant if args.tenant else ''}) in {', '.join(map(str, logs))}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(story.to_dict() | {"client_id": client_id}, indent=1))
        return EXIT_OK
    named_as = f", X-Request-Id {client_id}" if client_id else ""
    adapter = story.adapter
    under = f", adapter {adapter['name']} digest {adapter['digest']}" if adapter else ""
    print(f"request {story.request} (tenant {story.tenant}{named_as}{under})")
    for rec in story.records:
        print(f"  {_when(rec['ts'])} {rec['log']} #{rec['seq']} {rec['kind']}: {_fields(rec)}")
    for entry in story.to_dict()["pages"]:
        prev = entry["previous_holder"]
        before = ("no earlier holder in the log" if prev is None else
                  f"held before by {prev['request']} (tenant {prev['tenant']}), "
                  f"{'scrubbed' if entry['scrubbed_before_handed'] else 'NOT scrubbed'} before it was handed over")
        print(f"  page {entry['page']} ({entry['log']}, {entry['via']}): {before}")
        for rec in entry["history"]:
            print(f"    #{rec['seq']} {rec['kind']}: {_fields(rec)}")
    return EXIT_OK


# Mildest first: the worst of several logs is the last of these (not the highest exit code: a gap is 4).
_VERDICTS = {EXIT_OK: "OK", EXIT_GAP: "GAP", EXIT_TAMPERED: "BROKEN", EXIT_FOREIGN: "FOREIGN"}


def _severity(code: int) -> int:
    return list(_VERDICTS).index(code) if code in _VERDICTS else len(_VERDICTS)


def _parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).isoformat(timespec="milliseconds")


def _fields(rec: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in rec.items() if k not in ("seq", "ts", "kind", "prev", "log"))
