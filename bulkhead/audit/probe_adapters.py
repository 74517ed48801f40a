"""`bulkhead probe`'s adapter checks: a tenant's LoRA adapters are its own.

Tenant A lists adapter N that tenant B does not. adapter_names: B naming N
must get exactly what B gets for a name that exists nowhere (else B ran A's
weights, or learnt that N exists). adapter_timing: B must not tell prompts
cached under N by time to first token (AUC under AUC_LIMIT; the control is A
re-sending its own). The method is bench/side_channel.py's; docs/audit.md
gives the numbers. Prompts are token ids: exact without a tokenizer.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from bulkhead.audit.probe_client import ProbeClient
from bulkhead.audit.probe_report import CheckResult, ProbeReport

PREFIX_TOKENS = 129  # 8 full pages of 16: a hit computes 1 token instead of 129
CROSS_GUESSES = 10  # secrets, and as many decoys, per measurement
CONTROL_GUESSES = 4
AUC_LIMIT = 0.85
CONTROL_LEAST = 0.9
TOKEN_IDS = range(1000, 30000)  # ordinary word pieces in Llama-family, Qwen and GPT-2-style vocabularies


@dataclass(frozen=True)
class Owner:
    tenant: str  # A: owns the adapter
    adapter: str  # N
    other: str  # B: lists no adapter called N


def auc_quick_is_secret(secret_s: list[float], decoy_s: list[float]) -> float:
    """P(a secret's time < a decoy's), ties counting one half (bench/roc.py's AUC)."""
    wins = sum((s < d) + 0.5 * (s == d) for s in secret_s for d in decoy_s)
    return wins / (len(secret_s) * len(decoy_s))


class AdapterProbe:
    def __init__(self, client: ProbeClient, tenant_keys: dict[str, str], model: str,
                 context_length: int | None, clock: Callable[[], float] = time.perf_counter):
        """clock: what times the first token (a test's fake endpoint brings its own)."""
        self.client, self.keys, self.model, self.clock = client, tenant_keys, model, clock
        self.prefix_tokens = min(PREFIX_TOKENS, (context_length or PREFIX_TOKENS + 2) - 2)
        self.rng = random.Random(secrets.randbits(64))

    def run(self, report: ProbeReport) -> None:
        owner = self._owner()
        if owner is None:
            why = ("one tenant in the keys file" if len(self.keys) < 2 else
                   "no tenant lists an adapter another tenant lacks in GET /v1/models")
            report.checks += [CheckResult("adapter_names", status="skipped", detail=why),
                              CheckResult("adapter_timing", status="skipped", detail=why)]
            return
        report.checks.append(self.names(owner, report))
        report.checks.append(self.timing(owner, report))

    def _owner(self) -> Owner | None:
        listed = {t: self._models(key) for t, key in self.keys.items()}
        for tenant, models in listed.items():
            for adapter in models - {self.model}:
                other = next((t for t in listed if t != tenant and adapter not in listed[t]), None)
                if other is not None:
                    return Owner(tenant, adapter, other)
        return None

    def _models(self, key: str) -> set[str]:
        body = self.client.get_json("/v1/models", key) or {}
        return {str(m["id"]) for m in body.get("data") or [] if isinstance(m, dict) and m.get("id")}

    def names(self, owner: Owner, report: ProbeReport) -> CheckResult:
        key, nowhere = self.keys[owner.other], f"probe-nowhere-{secrets.token_hex(4)}"
        body = {"prompt": [TOKEN_IDS[0]] * 4, "max_tokens": 1, "temperature": 0}
        theirs = self.client.post(key, "/v1/completions", {**body, "model": owner.adapter})
        absent = self.client.post(key, "/v1/completions", {**body, "model": nowhere})
        result = CheckResult("adapter_names", 2, detail=f"tenant {owner.other!r} named tenant {owner.tenant!r}'s "
                                                        f"adapter {owner.adapter!r} and a name that exists nowhere")
        if theirs.status == 200:
            problem = "was served (HTTP 200): it ran on another tenant's adapter"
        elif (theirs.status, theirs.body.replace(owner.adapter, "X")) != \
                (absent.status, absent.body.replace(nowhere, "X")):
            problem = (f"got HTTP {theirs.status} where a name that exists nowhere got HTTP {absent.status}, or "
                       "another body: the answer tells that the adapter exists")
        else:
            return result
        report.find(result, f"tenant {owner.other!r} naming tenant {owner.tenant!r}'s adapter {owner.adapter!r} "
                    + problem, (owner.other, owner.tenant))
        return result

    def timing(self, owner: Owner, report: ProbeReport) -> CheckResult:
        a_key, b_key = self.keys[owner.tenant], self.keys[owner.other]
        n = CROSS_GUESSES + CONTROL_GUESSES
        secret_prompts = [self._prompt() for _ in range(n)]
        for prompt in secret_prompts:  # now in A's cache, under N's weights
            self.client.complete(a_key, self._body(prompt, owner.adapter))
        measured = {
            "other tenant": self._measure(b_key, self.model, secret_prompts[:CROSS_GUESSES]),
            "owner, base model": self._measure(a_key, self.model, secret_prompts[:CROSS_GUESSES]),
            "control": self._measure(a_key, owner.adapter, secret_prompts[CROSS_GUESSES:]),
        }
        result = CheckResult("adapter_timing", sum(len(s) + len(d) for s, d in measured.values()) + n)
        aucs = {name: auc_quick_is_secret(*times) for name, times in measured.items()}
        result.detail = (f"{self.prefix_tokens}-token prompts cached under tenant {owner.tenant!r}'s adapter "
                         f"{owner.adapter!r}; AUC " + ", ".join(f"{k} {v:.2f}" for k, v in aucs.items()))
        for name in ("other tenant", "owner, base model"):
            if aucs[name] >= AUC_LIMIT:
                who = (f"tenant {owner.other!r}" if name == "other tenant"
                       else f"tenant {owner.tenant!r} under the base model")
                report.find(result, f"{who} can tell prompts cached under tenant {owner.tenant!r}'s adapter "
                            f"{owner.adapter!r} by time to first token (AUC {aucs[name]:.2f} >= {AUC_LIMIT})",
                            (owner.other, owner.tenant))
        if aucs["control"] < CONTROL_LEAST:
            report.warnings.append(f"adapter timing: the owner's own cached prompts were not measurably quicker "
                                   f"(AUC {aucs['control']:.2f}): the cross-tenant result says little here")
        return result

    def _measure(self, key: str, model: str, secret_prompts: list[list[int]]) -> tuple[list[float], list[float]]:
        """Times to first token of each secret and as many decoys, sent one at a time in a random order."""
        guesses = [(True, p) for p in secret_prompts] + [(False, self._prompt()) for _ in secret_prompts]
        self.rng.shuffle(guesses)
        times: dict[bool, list[float]] = {True: [], False: []}
        for is_secret, prompt in guesses:
            start = self.clock()
            self.client.stream_first_chunk(key, self._body(prompt, model))
            times[is_secret].append(self.clock() - start)
        return times[True], times[False]

    def _prompt(self) -> list[int]:
        return [self.rng.choice(TOKEN_IDS) for _ in range(self.prefix_tokens)]

    def _body(self, prompt: list[int], model: str) -> dict:
        return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
