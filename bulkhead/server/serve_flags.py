"""`bulkhead serve`'s command line: every flag, in the groups an operator reads.

Plain `--help` shows what a deployment needs; `--help-all` adds the tuning,
kernel and developer switches, which parse the same either way
(tests/server/test_serve_help.py holds its limits). The long stories live in docs/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bulkhead.model import kernel_names  # not the kernel modules: a router's parser loads no torch
from bulkhead.server.params import DEFAULT_MAX_TOKENS

ROLES = ("local", "colocated", "router", "prefill", "decode")


class ServeHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" where the default is a value (None: the help says what)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS \
                or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)"


class _ShowAllHelp(argparse.Action):
    """--help-all: give the hidden flags back their help, print, exit."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        for action in parser._actions:
            if hasattr(action, "full_help"):
                action.help = action.full_help
        parser.epilog = None
        parser.print_help()
        parser.exit()


def _flag(group, *names: str, more: bool = False, **kwargs) -> None:
    """One flag; more=True: listed under --help-all only (it still parses)."""
    action = group.add_argument(*names, **kwargs)
    if more:
        action.full_help = action.help
        action.help = argparse.SUPPRESS


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = ServeHelpFormatter
    p.usage = "%(prog)s [options]"
    p.add_argument("--help-all", action=_ShowAllHelp,
                   help="show every flag: tuning, kernels and precision, developer and benchmark switches")
    _model_flags(p.add_argument_group("model"))
    _deployment_flags(p.add_argument_group("deployment", "docs/multihost.md has the multi-host recipe"))
    _tenant_flags(p.add_argument_group("tenants and limits", "keys.toml: docs/api.md, \"Keys, tenants and limits\""))
    _kv_flags(p.add_argument_group("KV and isolation"))
    _operations_flags(p.add_argument_group("operations"))
    _kernel_flags(p.add_argument_group("kernel overrides, for A/B runs (docs/performance.md, \"Kernel flags\")"))
    _developer_flags(p.add_argument_group("developer and benchmark switches"))
    hidden = sum(hasattr(a, "full_help") for a in p._actions)
    p.epilog = f"{hidden} more flags (tuning, kernels, developer switches): bulkhead serve --help-all"


def _model_flags(g) -> None:
    _flag(g, "--model", type=Path, default=None, metavar="DIR|FILE.gguf",
          help="Llama, Qwen2 or Mistral safetensors directory or GGUF file, its weights read as stored "
               "(default: the bundled SmolLM2-135M-Instruct)")
    _flag(g, "--precision", choices=kernel_names.PRECISIONS, default="auto",
          help="auto = the fastest kernels for the weights' format and this CPU, within the documented bound; "
               "exact = the fp32 reference everywhere")
    _flag(g, "--model-id", default=None, metavar="NAME", more=True,
          help="the name served in /v1/models (default: the directory's or file's name)")
    _flag(g, "--context-length", type=int, default=None, metavar="N",
          help="advertised context, prompt + max_tokens; refused at start-up if the KV pool cannot hold it "
               "(default: the model's)")
    _flag(g, "--clamp-context-length", action="store_true", more=True,
          help="if the KV pool cannot hold the context, advertise what it holds instead of refusing to start")
    _flag(g, "--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
          help="max_tokens of a request that names none; 0 gives the rest of the context, as vLLM does")


def _deployment_flags(g) -> None:
    _flag(g, "--role", choices=ROLES, default="local", metavar="ROLE",
          help="local: router + prefill + decode processes here; colocated: one process; router, prefill, "
               "decode: one part per host")
    _flag(g, "--host", default="127.0.0.1", help="address the HTTP API binds; beyond loopback needs --api-keys")
    _flag(g, "--port", type=int, default=8000,
          help="HTTP port; --role local also takes the next one for its control plane")
    _flag(g, "--prefill", type=int, default=1, metavar="N", help="prefill workers --role local starts")
    _flag(g, "--decode", type=int, default=1, metavar="N", help="decode workers --role local starts")
    _flag(g, "--core-sharing", choices=("lease", "split"), default="lease", more=True,
          help="--role local: lease = every worker uses every core, passes take turns; split = the cores "
               "divided among the workers")
    _flag(g, "--threads", type=int, default=None, metavar="N", more=True,
          help="torch threads of a model process (default: torch's; each local worker every core, or its share "
               "with --core-sharing split)")
    _flag(g, "--router", default=None, metavar="ADDR",
          help="prefill/decode: the router's control address, tcp://HOST:PORT (default: none)")
    _flag(g, "--control-address", default=None, metavar="ADDR",
          help="router: ZeroMQ address the workers reach (default: tcp://127.0.0.1:<port+1>)")
    _flag(g, "--worker-name", default=None, metavar="NAME",
          help="prefill/decode: a unique name, kept across restarts (default: ROLE-PID)")
    _flag(g, "--cluster-key-file", type=Path, default=None, metavar="FILE",
          help="HMAC key router and workers share (default: generated under ~/.cache/bulkhead)")
    _flag(g, "--transfer", choices=("shm", "tcp", "mooncake"), default="shm",
          help="how KV pages reach a decode worker; shm = same host only (docs/transfer.md)")
    _flag(g, "--transfer-host", default="127.0.0.1", metavar="ADDR", more=True,
          help="decode: the address its tcp/mooncake KV receiver listens on; multi-host names this host's")
    _flag(g, "--transfer-port", type=int, default=0, metavar="PORT", more=True,
          help="decode: its tcp/mooncake KV receiver's port; 0 = any free one, sent over the control plane")
    _flag(g, "--transfer-all-interfaces", action="store_true", more=True,
          help="mooncake: start although this host has interfaces beyond lo (Mooncake listens on all of them)")


def _tenant_flags(g) -> None:
    _flag(g, "--api-keys", type=Path, default=None, metavar="FILE",
          help="keys.toml: [keys], [operators], [tenants.NAME] limits (default: $BULKHEAD_API_KEYS, else one "
               "tenant on loopback)")
    _flag(g, "--max-running", type=int, default=32, metavar="N", help="most requests decoding at once")
    _flag(g, "--request-timeout", type=float, default=600.0, metavar="S",
          help="router: seconds before an unanswered request ends with a typed 504")
    _flag(g, "--prefill-chunk", type=int, default=512, metavar="N", more=True, help="prompt tokens per prefill pass")
    _flag(g, "--step-tokens", type=int, default=0, metavar="N", more=True,
          help="colocated: tokens one step carries; 0 = one prefill chunk beside a full decode batch")


def _kv_flags(g) -> None:
    _flag(g, "--kv-memory", default="2GiB", metavar="SIZE",
          help="KV pool of each model process: bytes (2GiB, 512MB) or a fraction of available RAM (0.25)")
    _flag(g, "--prefill-kv-memory", default=None, metavar="SIZE", more=True,
          help="KV pool of prefill workers (default: --kv-memory)")
    _flag(g, "--decode-kv-memory", default=None, metavar="SIZE", more=True,
          help="KV pool of decode workers (default: --kv-memory)")
    _flag(g, "--page-size", type=int, default=16, metavar="N", more=True, help="tokens per KV page")
    _flag(g, "--prefix-cache", choices=("auto", "on", "off"), default="auto",
          help="tenant-scoped prefix cache; auto = on for prefill workers, off colocated")
    _flag(g, "--scrub-mode", choices=("zero", "poison"), default="zero", more=True,
          help="how freed KV pages are scrubbed; poison (NaN) makes a stale read visible in tests")
    _flag(g, "--drain-lease", type=float, default=30.0, metavar="S", more=True,
          help="decode: seconds an unacknowledged remote writer may still write a failed request's pages")


def _operations_flags(g) -> None:
    _flag(g, "--log-level", default="info", type=str.lower,
          choices=("debug", "info", "warning", "error", "critical"), help="log level of bulkhead and uvicorn")
    _flag(g, "--drain-deadline", type=float, default=60.0, metavar="S",
          help="worker: on SIGTERM, seconds to finish what it holds before exiting")
    _flag(g, "--lineage-log", type=Path, default=None, metavar="FILE",
          help="hash-chained page-lineage log; each worker writes FILE's name + its own (default: none)")
    _flag(g, "--lineage-key", type=Path, default=None, metavar="FILE",
          help="the lineage log's own HMAC key, created if missing (default: none; --lineage-log needs it)")
    _flag(g, "--lineage-max-bytes", type=int, default=64 * 2**20, metavar="N", more=True,
          help="rotate a lineage log segment at this many bytes; the chain continues (default: %(default)s, 64 MiB)")


def _kernel_flags(g) -> None:
    _flag(g, "--dtype", choices=("float32", "bfloat16"), default="float32", more=True,
          help="weights as loaded and activations; the matmuls' precision is --linear-kernel's")
    _flag(g, "--kv-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto", more=True,
          help="KV cache element type; auto = bfloat16, attention computing in fp32")
    _flag(g, "--linear-kernel", choices=kernel_names.KERNELS, default="auto", metavar="KERNEL", more=True,
          help="linear layers: auto = the kernel table's pick; exact = fp32; /server_info's "
               "matmul_precision says what runs")
    _flag(g, "--decode-attention", choices=kernel_names.DECODE_ATTENTION, default="auto", more=True,
          help="c = a C kernel reading the paged pool in place; torch = gather + SDPA; auto = c where it builds")
    _flag(g, "--prefill-attention", choices=kernel_names.PREFILL_ATTENTION, default="auto", more=True,
          help="bf16 = a C kernel on bf16 dot products, fp32 sums; torch = fp32 SDPA; auto = bf16 beside "
               "bf16-input prompts")
    _flag(g, "--prefill-glue", choices=kernel_names.PREFILL_GLUE, default="auto", more=True,
          help="norms, rotary, SiLU of a prompt pass: c = one C call an op; auto = c beside the reduced-precision "
               "kernels")
    _flag(g, "--decode-glue", choices=kernel_names.DECODE_GLUE, default="auto", more=True,
          help="a decode step's ops around matmuls and attention: c = every layer in one C call; auto = c where "
               "it can run")
    _flag(g, "--decode-tile", type=int, default=16, metavar="N", more=True,
          help="batch invariance: pad decode batches to a measured row multiple, else tiles of N rows (0 = off)")


def _developer_flags(g) -> None:
    _flag(g, "--fairness", choices=("vtc", "fcfs"), default="vtc", more=True,
          help="colocated: vtc = least-served tenant's prompt first; fcfs measures what fairness costs")
    _flag(g, "--no-interjection", action="store_true", more=True,
          help="run long prefill passes whole, not a slice of layers a step while another tenant waits "
               "(to measure what slicing does)")
    _flag(g, "--no-kv-quotas", action="store_true", more=True,
          help="colocated: under page pressure preempt the newest request, not the tenant most over its share")
    _flag(g, "--no-safe-mode", action="store_true", more=True, help="skip the per-step page ownership check")
    _flag(g, "--unsafe-no-guards", action="store_true", more=True,
          help="BENCHMARK ONLY: no scrub, transfer digests or per-step checks; refused with API keys")
    _flag(g, "--worker-config", default=None, metavar="JSON", more=True,
          help="worker: its whole configuration as JSON, as --role local passes it (default: the flags)")


# The kernel overrides --precision exact would contradict: only their defaults go with it.
_EXACT_CONFLICTS = {"linear_kernel": "auto", "kv_dtype": "auto", "prefill_attention": "auto", "prefill_glue": "auto"}


def check_precision_flags(args: argparse.Namespace) -> str | None:
    """Why these flags cannot go together, or None: --precision exact is the
    fp32 reference everywhere, so a reduced-precision override beside it
    would make it a lie."""
    if args.precision != "exact":
        return None
    for dest, default in _EXACT_CONFLICTS.items():
        if getattr(args, dest) != default:
            flag = "--" + dest.replace("_", "-")
            return f"--precision exact is the fp32 reference everywhere; {flag} {getattr(args, dest)} contradicts it"
    return None

