"""argparse wiring for the audit commands: `add_subcommands(subparsers)`
adds `plan`, `preflight` and `probe`, each with `func(args) -> exit code`."""

from __future__ import annotations

import argparse

from bulkhead.audit.plan import DEFAULT_ACTIVATION_RESERVE, DEFAULT_MEM_FRACTION, run_plan
from bulkhead.audit.preflight import DEFAULT_TIMEOUT_S, run_preflight
from bulkhead.audit.probe import DEFAULT_CONCURRENCY, DEFAULT_MAX_TOKENS, run_probe
from bulkhead.audit.probe import DEFAULT_TIMEOUT_S as PROBE_TIMEOUT_S

PLAN_EPILOG = """\
example (the incident's shape: a 1,048,576-token context on a too-small pool):
  bulkhead plan --model deepseek-v3/config.json --accelerator-memory 141GiB \\
      --weights-bytes 690GB --tp 8 --context-length 1048576

Memory sizes accept 141GiB, 80GB, 1.5TiB or plain bytes.
exit codes: 0 the pool holds the context, 1 it does not, 2 bad input.
"""

PREFLIGHT_EPILOG = """\
example (a disaggregated SGLang pair, and a vLLM worker tagged as decode):
  bulkhead preflight http://10.0.0.1:30000 http://10.0.0.2:30000
  bulkhead preflight --json prefill=http://p:8000 decode=http://d:8000

Engines are recognised by their endpoints: bulkhead /server_info, SGLang
/server_info or /get_server_info plus /v1/models, vLLM /v1/models plus
/metrics, llama.cpp /props and /slots. A trailing /v1 is dropped.
ROLE=URL names a role the engine cannot state itself (vLLM).
exit codes: 0 clean, 1 findings, 2 an engine could not be read.
"""

PROBE_EPILOG = """\
example (two tenants against a local server; keys.toml as for `bulkhead serve --api-keys`):
  bulkhead probe http://127.0.0.1:8000 --keys keys.toml --concurrency 8 --max-tokens 16
  bulkhead probe http://vllm:8000/v1 --keys keys.toml --json --skip-coherence

keys.toml:
  [keys]
  "sk-alpha" = "alpha"
  "sk-beta" = "beta"

Checks: cross-tenant canary hits, over-length prompts that got no 4xx,
solo vs concurrent greedy outputs, long-context recall (coherence), and
aborted streams. Sends real completions: run it against a test deployment
or with keys whose traffic you may spend.
exit codes: 0 no findings, 1 findings, 2 unreachable endpoint or bad input.
"""


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face config.json, or the directory holding it")
    parser.add_argument("--accelerator-memory", required=True, help="memory of one accelerator, e.g. 141GiB")
    parser.add_argument("--weights-bytes", required=True, help="size of all model weights, e.g. 140GB or bytes")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per worker (default 1)")
    parser.add_argument("--mem-fraction", default=DEFAULT_MEM_FRACTION,
                        help=f"share of accelerator memory for weights + KV (default {DEFAULT_MEM_FRACTION})")
    parser.add_argument("--context-length", type=int, default=None,
                        help="context to advertise (default: config max_position_embeddings)")
    parser.add_argument("--kv-dtype", default="auto", help="KV cache dtype: auto (the config's), bfloat16, fp8_e4m3, ...")
    parser.add_argument("--page-size", type=int, default=1, help="tokens per KV page; the pool is whole pages (default 1)")
    parser.add_argument("--activation-reserve", default=DEFAULT_ACTIVATION_RESERVE,
                        help=f"per-rank memory kept for activations and graphs (default {DEFAULT_ACTIVATION_RESERVE})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_preflight_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URL", help="engine base URL, or ROLE=URL")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=f"seconds per request (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' to every engine")


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the OpenAI-compatible endpoint's base URL (with or without /v1)")
    parser.add_argument("--keys", required=True, help='TOML file with a [keys] table of "api-key" = "tenant"')
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--model", default=None, help="model to ask for (default: the first in /v1/models)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help=f"concurrent requests per tenant (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"max_tokens of each probe completion (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--timeout", type=float, default=PROBE_TIMEOUT_S,
                        help=f"seconds per request (default {PROBE_TIMEOUT_S:g})")
    parser.add_argument("--seed", type=int, default=None, help="seed sent with every greedy request")
    parser.add_argument("--allow-divergence-after", type=int, default=None, metavar="N",
                        help="differential: tolerate outputs that agree on their first N tokens (default: exact text)")
    parser.add_argument("--max-context", type=int, default=None, metavar="N",
                        help="coherence: cap the long prompt at N tokens (default: near the advertised limit)")
    parser.add_argument("--skip-coherence", action="store_true", help="skip the long-context recall check")
    parser.add_argument("--context-length", type=int, default=None,
                        help="context length to probe, when the endpoint does not advertise one")


COMMANDS = (  # name, help, description, epilog, arguments, run
    ("plan", "KV pool size from a model config and accelerator memory, against the context length",
     "Compute KV bytes per token and pool tokens per worker, and whether the pool holds the context.",
     PLAN_EPILOG, add_plan_arguments, run_plan),
    ("preflight", "read live limits from running engines and flag pools and pairs that disagree",
     "Read each engine's live limits and check pool vs context, input limits, and prefill/decode pairs.",
     PREFLIGHT_EPILOG, add_preflight_arguments, run_preflight),
    ("probe", "active cross-tenant leak and coherence probe against an OpenAI-compatible endpoint",
     "Send canary-carrying completions as several tenants and check for leaks, over-length requests answered "
     "2xx, solo vs concurrent divergence, long-context recall and abort safety.",
     PROBE_EPILOG, add_probe_arguments, run_probe),
)


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    for name, helptext, description, epilog, add_arguments, run in COMMANDS:
        parser = subparsers.add_parser(name, help=helptext, description=description, epilog=epilog,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(parser)
        parser.set_defaults(func=run)

