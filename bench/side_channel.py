"""Prefix-cache timing side channel: can one tenant tell, by time to first
token, whether another tenant has a prompt prefix cached? (CVE-2025-46570.)

    python bench/side_channel.py                       # 60 + 60 cross-tenant guesses, 12 + 12 within
    python bench/side_channel.py --cross 100 --prefix-tokens 513

Starts a disaggregated server (router + prefill + decode; the prefix cache is
on in prefill) with two tenants, victim and attacker. In blocks, the victim
first sends secret prompts of --prefix-tokens random token ids (so they sit in
the victim's cache), then guesses go out one at a time in random order:

  cross   the attacker sends each cross secret once, and as many decoys of
          the same length (fresh random ids, cached by nobody)
  within  the victim re-sends each within secret once, and as many decoys

Every guess is a prompt nobody of its tenant has sent before, so the
attacker's own cache never answers. The classifier reads "secret" when TTFT
is short; its ROC AUC for cross should be ~0.5 (target <= 0.55) and for
within near 1.0 (the cache works and the timing difference is measurable). A
prompt of 16k+1 tokens lets a hit skip all but one token of prefill.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.roc import auc_shorter_is_positive, chance_of_at_least, null_standard_error  # noqa: E402

VICTIM_KEY, ATTACKER_KEY = "sk-victim", "sk-attacker"
KEYS = {VICTIM_KEY: "victim", ATTACKER_KEY: "attacker"}
CROSS_TARGET = 0.55


@dataclass
class Measurement:
    name: str  # cross | within
    secrets_ttft: list[float]
    decoys_ttft: list[float]

    @property
    def auc(self) -> float:
        return auc_shorter_is_positive(self.secrets_ttft, self.decoys_ttft)

    def summary(self) -> dict:
        m, n = len(self.secrets_ttft), len(self.decoys_ttft)
        return {"auc": round(self.auc, 4), "secrets": m, "decoys": n,
                "null_standard_error": round(null_standard_error(m, n), 4),
                "chance_of_auc_at_least_this": round(chance_of_at_least(self.auc, m, n), 4),
                "median_ttft_secret_s": round(statistics.median(self.secrets_ttft), 4),
                "median_ttft_decoy_s": round(statistics.median(self.decoys_ttft), 4)}


def ttft(http: httpx.Client, url: str, key: str, prompt: list[int]) -> float:
    """Seconds from sending a streamed one-token completion to its first token."""
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with http.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                if chunk.get("choices"):
                    return time.perf_counter() - start
    raise RuntimeError("the stream ended without a token")


def measure(url: str, victim_key: str, attacker_key: str, cross: int, within: int, prefix_tokens: int,
            block: int = 8, seed: int = 0) -> tuple[Measurement, Measurement]:
    """`cross` attacker guesses of victim secrets (and as many decoys), `within` victim re-sends of its own
    secrets (and as many decoys), in blocks of at most `block` secrets cached at a time."""
    rng = random.Random(seed)

    def fresh() -> list[int]:
        return [rng.randrange(1000, 40000) for _ in range(prefix_tokens)]

    results = {"cross": Measurement("cross", [], []), "within": Measurement("within", [], [])}
    todo = ["cross"] * cross + ["within"] * within
    rng.shuffle(todo)  # each block mixes both measurements, so both see the same machine load
    with httpx.Client(timeout=600) as http:
        ttft(http, url, victim_key, fresh())  # warm-up: first-request costs land on no measurement
        for b in range(0, len(todo), block):
            secrets = [(name, fresh()) for name in todo[b : b + block]]
            for _, secret in secrets:
                ttft(http, url, victim_key, secret)  # the victim caches it
            guesses = []
            for name, secret in secrets:
                key = attacker_key if name == "cross" else victim_key
                guesses += [(name, key, secret, True), (name, key, fresh(), False)]
            rng.shuffle(guesses)
            for name, key, prompt, is_secret in guesses:
                t = ttft(http, url, key, prompt)
                m = results[name]
                (m.secrets_ttft if is_secret else m.decoys_ttft).append(t)
    return results["cross"], results["within"]


def render(cross: Measurement, within: Measurement, prefix_tokens: int) -> str:
    lines = [f"prefix-cache timing side channel, prompts of {prefix_tokens} tokens, TTFT as the classifier",
             f"{'':<8} {'ROC AUC':>8} {'N secret+decoy':>15} {'chance SE':>9} {'median TTFT secret/decoy':>25}"]
    for m in (cross, within):
        s = m.summary()
        lines.append(f"{m.name:<8} {s['auc']:>8.3f} {s['secrets']:>7}+{s['decoys']:<7} {s['null_standard_error']:>9.3f}"
                     f" {s['median_ttft_secret_s']:>12.3f}s / {s['median_ttft_decoy_s']:.3f}s")
    ok_cross, ok_within = cross.auc <= CROSS_TARGET, within.auc >= 0.9
    lines.append(f"cross-tenant AUC {'<=' if ok_cross else '>'} {CROSS_TARGET} (target); "
                 f"within-tenant AUC {'>=' if ok_within else '<'} 0.9 (the cache works)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tests.server_process import ServerProcess

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cross", type=int, default=60, help="attacker guesses of victim secrets (and as many decoys)")
    ap.add_argument("--within", type=int, default=12, help="victim re-sends of its own secrets (and as many decoys)")
    ap.add_argument("--prefix-tokens", type=int, default=257, help="prompt length; 16k+1 so a hit skips all but one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="server log directory")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    keys_file = args.out / "side-channel-keys.toml"
    keys_file.write_text("[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in KEYS.items()))
    server = ServerProcess(["--role", "local", "--api-keys", str(keys_file), "--scrub-mode", "poison",
                            "--kv-memory", "512MiB", "--context-length", "2048"],
                           args.out / "side-channel.log").wait_ready(timeout=300)
    try:
        cross, within = measure(server.url, VICTIM_KEY, ATTACKER_KEY, args.cross, args.within, args.prefix_tokens,
                                seed=args.seed)
    finally:
        server.stop()
    print(render(cross, within, args.prefix_tokens))
    if args.json:
        args.json.write_text(json.dumps({"prefix_tokens": args.prefix_tokens, "cross": cross.summary(),
                                         "within": within.summary(), "raw": [asdict(cross), asdict(within)]},
                                        indent=2))
    return 0 if cross.auc <= CROSS_TARGET and within.auc >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
