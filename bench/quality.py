"""Agreement of bulkhead's reduced-precision kernels with the exact fp32 model.

    python bench/quality.py                  # the table in docs/performance.md
    python bench/quality.py --tokens 16      # a quicker look
    python bench/quality.py --model DIR --only "bf16 weights"   # another checkpoint (bench/checkpoints.py)

A fixed prompt set (below). For each prompt the exact model (fp32 linear
layers and lm_head throughout, `--linear-kernel onednn`) continues greedily
for `--tokens` tokens; every variant then reads the same tokens the way the
server computes them (the prompt as one prefill chunk, then one decode step
per token, through the model runner and the paged KV cache), and its
next-token distribution at each position is compared with the exact one:
top-1 agreement, KL(exact || variant) in nats (mean and max), and the largest
logit difference. Last, each variant answers the README's question greedily
(chat template, until end of sequence), as `make serve` would at
temperature 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bulkhead.engine.builder import PREFILL_ROW_BUCKET  # noqa: E402
from bulkhead.engine.runner import ModelRunner, RunnerConfig  # noqa: E402
from bulkhead.engine.scheduler import DecodeWork, PrefillWork, StepPlan  # noqa: E402
from bulkhead.kv.layout import KVLayout  # noqa: E402
from bulkhead.kv.ledger import PageLedger  # noqa: E402
from bulkhead.kv.pool import KVPool  # noqa: E402
from bulkhead.model import decode_kernel, linear_kernel, prefill_attention, prefill_glue  # noqa: E402
from bulkhead.model.gguf_import import default_model_dir  # noqa: E402
from bulkhead.model.llama import LlamaModel  # noqa: E402
from bulkhead.model.loader import load_weights  # noqa: E402
from bulkhead.model.tokenizer import Tokenizer  # noqa: E402

README_QUESTION = "What is the capital of France?"
# (text, as a chat message?) -- fixed, so that runs compare.
PROMPTS = (
    (README_QUESTION, True),
    ("Explain in two sentences why the sky is blue.", True),
    ("Write a haiku about the sea.", True),
    ("Give me three tips for learning a new language.", True),
    ("The capital of France is", False),
    ("Once upon a time, in a small village,", False),
    ("def fibonacci(n):", False),
    ("In 1969, the first humans to walk on the Moon were", False),
)
# name -> (linear kernel, lm_head kernel[, KV cache dtype[, decode glue[, prefill
# attention[, prefill glue]]]]), "auto" resolved as the engine does; the first
# is the reference.
VARIANTS = {
    "exact fp32 (onednn)": ("onednn", "fp32"),
    "fp32 layers, bf16w lm_head": ("onednn", "bf16w"),
    "q4 decode, fp32 lm_head": ("q4", "fp32"),
    "q4 decode, bf16w lm_head": ("q4", "bf16w"),
    "q4 decode, bf16w lm_head, bf16 KV (fp32 prompts: --linear-kernel q4)": ("q4", "bf16w", "bfloat16"),
    "q4 decode, fp32 lm_head, bf16 KV": ("q4", "fp32", "bfloat16"),
    # The q4 rows above run a decode step's layers in one C call (the
    # default, bulkhead.model.decode_layers); this one through torch ops.
    "q4 decode, bf16w lm_head, bf16 KV, torch glue": ("q4", "bf16w", "bfloat16", "torch"),
    # Where the CPU has AVX-512 BF16 and VNNI: prompts' inputs and the 4-bit
    # weights rounded to bf16, fp32 sums, their attention on bf16 dot products
    # (the default) or fp32 SDPA; decode rows' inputs as 16-bit integers per
    # group of 32 (q4-i16in).
    "bf16-input prompts, bf16 prompt attention, 16-bit-integer-input decode, bf16w lm_head, bf16 KV":
        ("q4-i16in", "bf16w", "bfloat16"),
    "bf16-input prompts, fp32 prompt attention, 16-bit-integer-input decode, fp32 lm_head, fp32 KV":
        ("q4-i16in", "fp32", "float32", "auto", "torch"),
    # And the lm_head's 8-bit weights (a Q8_0 tensor) rebuilt exactly, its
    # inputs as 16-bit integers per group (q8-i16in, q4-i16in's lm_head).
    "fp32 layers, 16-bit-integer-input lm_head (the lm_head's own cost)": ("onednn", "q8-i16in"),
    "bf16-input prompts, bf16 prompt attention, 16-bit-integer-input decode and lm_head, bf16 KV (the default)":
        ("q4-i16in", "q8-i16in", "bfloat16"),
    # The rows above run a prompt's norms, rotary and SiLU in C (the default,
    # bulkhead.model.prefill_glue); this one through torch ops.
    "the default, prompt glue through torch ops": ("q4-i16in", "q8-i16in", "bfloat16", "auto", "auto", "torch"),
    # A checkpoint stored in bf16 (--model; bench/checkpoints.py bf16): its weights as stored,
    # prompts' inputs rounded to bf16, decode rows' not (the bf16 kernel).
    "bf16 weights, bf16-input prompts, fp32 prompt attention, fp32-input decode, bf16w lm_head, fp32 KV":
        ("bf16", "bf16w", "float32", "auto", "torch"),
    "bf16 weights, bf16-input prompts, bf16 prompt attention, fp32-input decode, bf16w lm_head, bf16 KV "
    "(auto for a bf16 checkpoint)": ("bf16", "bf16w", "bfloat16"),
}


class Runner:
    """One variant's model, pool and runner, as the engine builds them."""

    def __init__(self, config, weights, max_tokens: int, kernel: str, head: str, kv_dtype: str = "float32",
                 glue: str = "auto", prompt_attention: str = "auto", prompt_glue: str = "auto"):
        attention = decode_kernel.choose("auto", kv_dtype, config.num_heads, config.num_kv_heads, config.head_dim, 16)
        prompt_attention = prefill_attention.choose(prompt_attention, kernel, config.head_dim)
        model = LlamaModel(config, linear_kernel.prepare(weights, kernel, head), attention, glue, prompt_attention,
                           prefill_glue.choose(prompt_glue, kernel))
        self.layout = KVLayout(config.num_layers, config.num_kv_heads, config.head_dim, 16, kv_dtype)
        pages = self.layout.pages_for_tokens(max_tokens)
        self.pool, self.ledger = KVPool(self.layout, pages), PageLedger(pages)
        # Decode rows padded to 2, the multiple the engine measures for oneDNN fp32
        # (bf16w gives a row the same numbers at any count).
        self.runner = ModelRunner(model, self.pool, self.ledger,
                                  RunnerConfig(decode_row_multiple=2, prefill_row_bucket=PREFILL_ROW_BUCKET))
        self.n = 0

    def logits(self, prompt: list[int], then: list[int]) -> list[torch.Tensor]:
        """Logits after the prompt (prefill) and after each token of `then` (decode steps)."""
        rid = f"q{self.n}"
        self.n += 1
        pages = tuple(self.ledger.allocate(rid, "t", self.layout.pages_for_tokens(len(prompt) + len(then) + 1)))
        try:
            _, first = self.runner.run(StepPlan(PrefillWork(rid, "t", 0, tuple(prompt), pages, True), (), ()))
            out = [first[0]]
            for i, tok in enumerate(then):
                _, lg = self.runner.run(StepPlan(None, (DecodeWork(rid, "t", len(prompt) + i, tok, pages),), ()))
                out.append(lg[0])
            return out
        finally:
            self.ledger.release(rid)
            self.ledger.mark_scrubbed(self.ledger.dirty_pages())

    def greedy(self, prompt: list[int], max_new: int, eos: tuple[int, ...]) -> list[int]:
        rid = f"g{self.n}"
        self.n += 1
        pages = tuple(self.ledger.allocate(rid, "t", self.layout.pages_for_tokens(len(prompt) + max_new + 1)))
        try:
            _, lg = self.runner.run(StepPlan(PrefillWork(rid, "t", 0, tuple(prompt), pages, True), (), ()))
            out = [int(lg[0].argmax())]
            while len(out) < max_new and out[-1] not in eos:
                _, lg = self.runner.run(StepPlan(None, (DecodeWork(rid, "t", len(prompt) + len(out) - 1, out[-1],
                                                                   pages),), ()))
                out.append(int(lg[0].argmax()))
            return out
        finally:
            self.ledger.release(rid)
            self.ledger.mark_scrubbed(self.ledger.dirty_pages())


def encode(tok: Tokenizer, text: str, chat: bool) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]) if chat else text)


def compare(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict:
    r, g = torch.stack(ref).double(), torch.stack(got).double()
    kl = (F.softmax(r, -1) * (F.log_softmax(r, -1) - F.log_softmax(g, -1))).sum(-1)  # [positions]
    return {"positions": r.shape[0], "top1": int((r.argmax(-1) == g.argmax(-1)).sum()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "max_diff": float((r - g).abs().max())}


def measure(tokens: int, variants: dict = VARIANTS, model_dir: Path | None = None) -> tuple[dict, dict]:
    """({variant: totals over the prompt set}, {variant: README answer}) for
    the model at `model_dir` (the bundled SmolLM2 by default)."""
    model_dir = model_dir or default_model_dir()
    config, weights = load_weights(model_dir, torch.float32)
    tok = Tokenizer(model_dir)
    prompts = [encode(tok, text, chat) for text, chat in PROMPTS]
    longest = max(len(p) for p in prompts) + tokens + 64
    # One variant's model in memory at a time: four copies of the weights
    # and their pools do not fit beside a busy machine's other work.
    names = list(variants)
    ref = Runner(config, weights, longest, *variants[names[0]])
    teacher = [ref.greedy(p, tokens, ()) for p in prompts]  # the exact model's own continuation
    ref_logits = [ref.logits(p, t[:-1]) for p, t in zip(prompts, teacher)]
    totals, answers = {}, {}
    for name in names:
        runner = ref if name == names[0] else Runner(config, weights, longest, *variants[name])
        per = [compare(rl, runner.logits(p, t[:-1])) for p, t, rl in zip(prompts, teacher, ref_logits)]
        totals[name] = {"positions": sum(x["positions"] for x in per), "top1": sum(x["top1"] for x in per),
                        "kl_mean": sum(x["kl_mean"] * x["positions"] for x in per) / sum(x["positions"] for x in per),
                        "kl_max": max(x["kl_max"] for x in per), "max_diff": max(x["max_diff"] for x in per)}
        answer = runner.greedy(prompts[0], 32, config.eos_token_ids)
        answers[name] = tok.decode([t for t in answer if t not in config.eos_token_ids])
        print(f"{name}: done", file=sys.stderr, flush=True)
        del runner
    return totals, answers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens of the exact model per prompt")
    ap.add_argument("--only", default="", help="comma list: run only the variants whose names contain one of "
                                               "these (the reference always runs)")
    ap.add_argument("--model", type=Path, default=None, help="a model directory (default: the bundled SmolLM2)")
    args = ap.parse_args(argv)
    wanted = [w for w in args.only.split(",") if w]
    variants = {name: v for i, (name, v) in enumerate(VARIANTS.items())
                if i == 0 or not wanted or any(w in name for w in wanted)}
    totals, answers = measure(args.tokens, variants, args.model)
    print(f"{len(PROMPTS)} prompts, {args.tokens} tokens each, against {next(iter(variants))}\n")
    print("| variant | top-1 agreement | KL mean (nats) | KL max | max logit diff | README answer |")
    print("|---|---:|---:|---:|---:|---|")
    for name, t in totals.items():
        print(f"| {name} | {t['top1']}/{t['positions']} ({100 * t['top1'] / t['positions']:.1f}%) | "
              f"{t['kl_mean']:.2e} | {t['kl_max']:.2e} | {t['max_diff']:.3f} | {answers[name]!r} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
