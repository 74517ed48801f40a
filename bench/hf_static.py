"""The transformers peer: `generate` over static batches, in a process of its
own so that its memory can be measured like a server's (bench/peers.py).

    python bench/hf_static.py MODEL_DIR PROMPTS.json --batch 4 --output-tokens 128
    python bench/hf_static.py MODEL_DIR --prefill 4096

Prints one JSON line. A batch's requests all get their first token when the
batch does: its time to first token is that of every request in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList


class StepClock(StoppingCriteria):
    """Called once per generated token: records when each one was ready."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def generate_batch(model, batch: list[list[int]], output_tokens: int) -> tuple[list[dict], float]:
    ids = torch.tensor(batch)  # [B, prompt_tokens]: equal lengths, no padding
    clock = StepClock()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_tokens,
                             min_new_tokens=output_tokens, do_sample=False, pad_token_id=0,
                             stopping_criteria=StoppingCriteriaList([clock]))
    end = time.perf_counter()
    made = out.shape[1] - ids.shape[1]
    first = clock.times[0]
    record = {"ttft": first - start, "tpot": (end - first) / max(1, made - 1), "tokens": made}
    return [record] * len(batch), end - start


def run_static(model, prompts: list[list[int]], batch: int, output_tokens: int) -> dict:
    generate_batch(model, prompts[:batch], 2)  # warm-up
    records, wall = [], 0.0
    for i in range(0, len(prompts), batch):
        got, took = generate_batch(model, prompts[i : i + batch], output_tokens)
        records += got
        wall += took
    return {"wall_s": wall, "records": records}


def run_prefill(model, tokens: int, reps: int = 2) -> dict:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1000, 40000, (1, tokens), generator=g)
    times = []
    with torch.no_grad():
        model(ids[:, :256])  # warm-up
        for _ in range(reps):
            start = time.perf_counter()
            model(ids, use_cache=True)
            times.append(time.perf_counter() - start)
    return {"tokens": tokens, "seconds": statistics.median(times), "tok_s": tokens / statistics.median(times)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("prompts", nargs="?", help="JSON list of token-id lists")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=0, help="measure one prompt of this many tokens instead")
    args = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    if args.prefill:
        result = run_prefill(model, args.prefill)
    else:
        with open(args.prompts) as f:
            prompts = json.load(f)
        result = run_static(model, prompts, args.batch, args.output_tokens)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
