"""Turn a step's logits into tokens (and logprobs) under each request's params."""

from __future__ import annotations

import torch

from bulkhead.engine.grammar_mask import GrammarMasks
from bulkhead.engine.outputs import TokenLogprobs
from bulkhead.engine.request import Request


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], grammars: GrammarMasks | None = None):
        self.eos_token_ids = eos_token_ids
        self._generators: dict[str, torch.Generator] = {}
        self.grammars = grammars if grammars is not None else GrammarMasks(None, 0, eos_token_ids)

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self.grammars.forget(request_id)

    def get_state(self, request_id: str) -> bytes | None:
        """The request's generator state, to continue sampling in another process."""
        gen = self._generators.get(request_id)
        return None if gen is None else bytes(gen.get_state().tolist())

    def set_state(self, request_id: str, state: bytes) -> None:
        gen = torch.Generator()
        gen.set_state(torch.tensor(list(state), dtype=torch.uint8))
        self._generators[request_id] = gen

    def _generator(self, req: Request) -> torch.Generator | None:
        if req.params.seed is None:
            return None
        gen = self._generators.get(req.request_id)
        if gen is None:
            gen = torch.Generator().manual_seed(req.params.seed)
            self._generators[req.request_id] = gen
        return gen

    def sample(self, requests: list[Request], logits: torch.Tensor,
               greedy_picks: list[int] | None = None) -> tuple[list[int], list[TokenLogprobs | None]]:
        """logits: [len(requests), V] float32 raw model output; logprobs are the
        model's own (before bias, penalties and grammar), as vLLM's are.
        greedy_picks: the step's own argmax per row (ModelRunner.greedy_picks),
        taken when every row samples greedily from its raw logits."""
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] = []
        if not requests:
            return tokens, logprobs  # a prefill chunk that does not end its prompt
        allowed = self.grammars.masked(requests, logits)  # [B, V]: -inf where a request's grammar forbids
        plain_greedy = all(r.params.greedy and not r.params.logit_bias and not r.params.penalized
                           and not self._suppressed(r) for r in requests)
        if plain_greedy:
            raw = greedy_picks is not None and allowed is logits  # no grammar masked a row
            tokens = list(greedy_picks) if raw else argmax_rows(allowed)
        for i, req in enumerate(requests):
            if not plain_greedy:
                tokens.append(self._sample_row(req, allowed[i]))
            if req.params.logprobs is not None:
                logprobs.append(self._logprobs(req, logits[i], tokens[i]))
            else:
                logprobs.append(None)
        return tokens, logprobs

    def _suppressed(self, req: Request) -> tuple[int, ...]:
        # min_tokens: the request may not end before it has that many tokens.
        if len(req.output_token_ids) >= req.params.min_tokens:
            return ()
        eos = () if req.params.ignore_eos else self.eos_token_ids
        return tuple(eos) + req.params.stop_token_ids

    def _sample_row(self, req: Request, row: torch.Tensor) -> int:
        p = req.params
        row = row.clone()
        for token_id, bias in p.logit_bias:
            row[token_id] += bias
        if p.penalized:
            apply_penalties(row, p, req.prompt_token_ids, req.output_token_ids)
        banned = self._suppressed(req)
        if banned:
            kept = row.clone()
            row[list(banned)] = float("-inf")
            if not torch.isfinite(row).any():
                # A grammar that is complete allows only EOS: it ends the
                # answer even before min_tokens (else nothing is samplable).
                row = kept
        if p.greedy:
            return argmax_rows(row[None])[0]
        row = row / p.temperature
        if p.top_k > 0:
            kth = torch.topk(row, min(p.top_k, row.shape[0])).values[-1]
            row[row < kth] = float("-inf")
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            cumulative = sorted_probs.cumsum(0)
            # Keep the smallest prefix whose mass reaches top_p (always >= 1 token).
            drop = cumulative - sorted_probs > p.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._generator(req)))

    @staticmethod
    def _logprobs(req: Request, row: torch.Tensor, token_id: int) -> TokenLogprobs:
        lp = torch.log_softmax(row, dim=-1)
        k = req.params.logprobs or 0
        top = ()
        if k:
            values, ids = torch.topk(lp, k)
            top = tuple(zip(ids.tolist(), values.tolist()))
        return TokenLogprobs(token_id, float(lp[token_id]), top)


def argmax_rows(x: torch.Tensor) -> list[int]:
    """Each row's argmax ([B, V] -> B ids), ties and NaN as torch.argmax
    takes them. Through numpy for float32: its argmax is vectorised where
    torch's CPU one is not (11 against 130 us for a row of a 49k vocabulary)."""
    if x.dtype == torch.float32 and x.device.type == "cpu":
        return x.numpy().argmax(axis=-1).tolist()
    return x.argmax(dim=-1).tolist()


def apply_penalties(row: torch.Tensor, params, prompt_ids, output_ids) -> None:
    """In place, on one request's logits ([V]): its own tokens only, so a
    row never depends on its batch-mates (batch invariance holds). The
    output includes the first token, which prefill sampled and decode was
    handed, so the penalties read the same history in either deployment."""
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long)
        if len(seen):
            logits = row[seen]
            row[seen] = torch.where(logits > 0, logits / params.repetition_penalty,
                                    logits * params.repetition_penalty)
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids, counts = torch.unique(torch.tensor(output_ids, dtype=torch.long), return_counts=True)
        row[ids] -= params.presence_penalty + params.frequency_penalty * counts.to(row.dtype)


def prompt_logprobs(rows: torch.Tensor, start: int, prompt_ids: list[int], k: int) -> dict[int, TokenLogprobs]:
    """Echo's prompt logprobs from one chunk's logits (rows [len, V], row j
    at position start + j): by position p >= 1, prompt token p's logprob
    given the tokens before it, plus the top k. The raw model's, before any
    penalty or bias: they describe the prompt, which nothing sampled."""
    n = min(len(rows), len(prompt_ids) - 1 - start)  # the last prompt row predicts the first output
    if n <= 0:
        return {}
    lp = torch.log_softmax(rows[:n].float(), dim=-1)  # [n, V]
    targets = torch.tensor(prompt_ids[start + 1:start + 1 + n], dtype=torch.long)
    chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
    tops = [()] * n
    if k:
        values, ids = torch.topk(lp, k, dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return {start + 1 + j: TokenLogprobs(int(targets[j]), chosen[j], tops[j]) for j in range(n)}
