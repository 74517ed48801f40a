"""`bulkhead admin`: list, drain and resume a deployment's workers.

    bulkhead admin workers URL             name, role, state, requests in flight
    bulkhead admin drain URL NAME [--force]  assign it nothing more; it finishes what it holds
    bulkhead admin resume URL NAME         assign to it again

URL is the server's base URL (a trailing /v1 is dropped). The operator key
comes from --key or BULKHEAD_OPERATOR_KEY. Exit status: 0 done, 1 the server
refused (its typed error is printed), 2 bad usage, 3 unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx

REFUSED, UNREACHABLE = 1, 3


def add_subcommand(subparsers) -> None:
    parser = subparsers.add_parser("admin", help="list, drain and resume the workers of a running deployment",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True)
    for action, helptext in (("workers", "list the workers and their state"),
                             ("drain", "assign a worker nothing more; it finishes what it holds"),
                             ("resume", "assign to a drained worker again")):
        p = actions.add_parser(action, help=helptext)
        p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
        if action != "workers":
            p.add_argument("name", help="the worker's name, as `bulkhead admin workers` lists it")
        if action == "drain":
            p.add_argument("--force", action="store_true",
                           help="drain even the last worker of its role (every request is refused until one returns)")
        p.add_argument("--key", default=None, help="operator key (default: $BULKHEAD_OPERATOR_KEY)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/").removesuffix("/v1")
    key = args.key or os.environ.get("BULKHEAD_OPERATOR_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(timeout=30.0, headers=headers) as client:
            if args.action == "workers":
                response = client.get(f"{base}/admin/workers")
            else:
                body = {"force": True} if getattr(args, "force", False) else {}
                response = client.post(f"{base}/admin/workers/{args.name}/{args.action}", json=body)
    except httpx.HTTPError as e:
        print(f"bulkhead admin: cannot reach {base}: {e}", file=sys.stderr)
        return UNREACHABLE
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        error = body.get("error", {}) if isinstance(body, dict) else {}  # a proxy's page: no OpenAI shape
        print(f"bulkhead admin: {response.status_code} {error.get('code', '')}: {error.get('message', response.text)}",
              file=sys.stderr)
        return REFUSED
    rows = body["workers"] if args.action == "workers" else [body]
    print(f"{'name':16} {'role':8} {'state':9} routes")
    for w in rows:
        print(f"{w['name']:16} {w['role']:8} {w['state']:9} {w.get('routes', '')}")
    return 0
