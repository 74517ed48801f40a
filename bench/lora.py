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

    .venv/bin/python -m bench.lora --rounds 3 [--role colocated]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import torch

from bench.lora_adapters import write_adapter
from bench.workload import Endpoint, closed_loop, make_prompts, summarise, unseen
from bulkhead.lora.peft_files import BaseShapes
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import default_model_dir
from tests.server_process import ServerProcess

KEY = "sk-bench-lora"
ADAPTERS = ("a0", "a1", "a2", "a3")
LEVELS = {"base-16": (16, False), "lora-16": (16, True), "base-1": (1, False), "lora-1": (1, True)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--role", default=None, help="serve's --role (default: serve's default deployment)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "lora.json")
    return p.parse_args(argv)


def write_setup(work: Path, model_dir: Path, rank: int) -> Path:
    """The adapters and a keys file naming them; returns the keys file."""
    shapes = BaseShapes.of(load_model_config(model_dir))
    lines = ["[keys]", f'"{KEY}" = "bench"', "", "[tenants.bench.adapters]"]
    for i, name in enumerate(ADAPTERS):
        path = write_adapter(work / name, shapes, rank=rank, alpha=2 * rank, seed=i, scale=0.02, dtype=torch.bfloat16)
        lines.append(f'{name} = "{path}"')
    keys = work / "keys.toml"
    keys.write_text("\n".join(lines) + "\n")
    return keys


def run_level(url: str, name: str, prompts, output: int) -> dict:
    clients, lora = LEVELS[name]
    endpoints = [Endpoint(url, ADAPTERS[i % len(ADAPTERS)] if lora else "bench") for i in range(clients)]
    headers = {"Authorization": f"Bearer {KEY}"}
    asyncio.run(closed_loop(endpoints[0], [unseen(prompts[0])], 1, 4, endpoints[:1], headers))  # warm-up
    run = asyncio.run(closed_loop(endpoints[0], prompts, clients, output, endpoints, headers))
    return summarise(run["wall_s"], run["records"], output)


def pooled(rounds: list[dict], name: str) -> float:
    return sum(r[name]["output_tokens"] for r in rounds) / sum(r[name]["wall_s"] for r in rounds)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tokenizers import Tokenizer

    model_dir = default_model_dir()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keys = write_setup(work, model_dir, args.rank)
        role = ["--role", args.role] if args.role else []
        server = ServerProcess([*role, "--api-keys", str(keys), "--model-id", "bench"],
                               work / "server.log").wait_ready(timeout=600)
        rounds = []
        try:
            for r in range(args.rounds):
                order = list(LEVELS) if r % 2 == 0 else list(reversed(LEVELS))
                result = {}
                for i, name in enumerate(order):
                    n = 32 if LEVELS[name][0] == 16 else 6
                    prompts = make_prompts(tokenizer, n, args.prompt_tokens, seed=1000 * r + i)
                    result[name] = run_level(server.url, name, prompts, args.output)
                    print(f"round {r + 1} {name}: {result[name]['tok_s']:.1f} tok/s, "
                          f"TPOT {result[name]['tpot_median_s'] * 1000:.1f} ms"
                          + (f" INVALID: {result[name]['invalid']}" if "invalid" in result[name] else ""), flush=True)
                rounds.append(result)
            adapters = server.info().get("adapters", {})
        finally:
            server.stop()
    if any("invalid" in level for r in rounds for level in r.values()):
        print("some level did not finish as asked: no ratio")
        return 1
    ratios = {"16 clients over 4 adapters / base": pooled(rounds, "lora-16") / pooled(rounds, "base-16"),
              "1 client on an adapter / base": pooled(rounds, "lora-1") / pooled(rounds, "base-1")}
    for what, ratio in ratios.items():
        print(f"{what}: {ratio:.2f}x (pooled over {len(rounds)} rounds)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds,
                                    "ratios": ratios, "adapters": adapters}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
