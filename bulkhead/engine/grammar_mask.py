"""The token mask of grammar-guided requests, one llguidance matcher each.

A matcher is built the first time its request is sampled and kept in step
with the request's own output tokens, whoever sampled them: a decode worker
rebuilds it from the ticket's grammar and advances it over prefill's first
token, so the mask state survives the handoff without crossing it. Each
row's mask depends only on its own request: batch invariance holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from bulkhead.engine.request import Request
from bulkhead.model import guidance

log = logging.getLogger(__name__)

_BITS = torch.arange(32, dtype=torch.int32)  # bit i of a mask word allows token 32 * word + i


@dataclass
class _Tracked:
    matcher: object  # llguidance.LLMatcher
    consumed: int = 0  # output tokens already fed to the matcher


class GrammarMasks:
    def __init__(self, tokenizer_json: str | None, vocab_size: int, eos_token_ids: tuple[int, ...]):
        """tokenizer_json None: no grammar support (a test engine without a tokenizer)."""
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._tracked: dict[str, _Tracked] = {}

    def forget(self, request_id: str) -> None:
        self._tracked.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._tracked)

    def request_ids(self) -> set[str]:
        return set(self._tracked)

    def masked(self, requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
        """logits: [B, V]. The same tensor when no request is guided, else a
        copy whose guided rows hold -inf at every token their grammar forbids."""
        rows = [i for i, r in enumerate(requests) if r.params.grammar is not None]
        if not rows:
            return logits
        words = (logits.shape[1] + 31) // 32
        bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)  # [R, W]
        for k, i in enumerate(rows):
            m = self._synced(requests[i])
            m.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), words * 4)
            if m.is_error():  # unreachable while only allowed tokens are sampled; end the answer, say why
                log.error("grammar matcher for %s failed: %s", requests[i].request_id, m.get_error())
                bitmask[k] = 0
                for eos in self.eos_token_ids:
                    bitmask[k, eos // 32] |= 1 << (eos % 32)
        # [R, W, 32] -> [R, V]: one torch op unpacks every row, no loop over the vocabulary
        allowed = ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().reshape(len(rows), -1)[:, : logits.shape[1]]
        out = logits.clone()
        index = torch.tensor(rows, dtype=torch.long)
        out[index] = out[index].masked_fill(~allowed, float("-inf"))
        return out

    def _synced(self, req: Request):
        tracked = self._tracked.get(req.request_id)
        if tracked is None:
            if self._tokenizer_json is None:
                raise RuntimeError("this engine was built without a tokenizer: it cannot serve a grammar")
            tok = guidance.tokenizer(self._tokenizer_json, self.vocab_size, self.eos_token_ids)
            tracked = self._tracked[req.request_id] = _Tracked(guidance.matcher(req.params.grammar, tok))
        pending = req.output_token_ids[tracked.consumed:]
        if pending:
            tracked.matcher.consume_tokens(pending)
            tracked.consumed += len(pending)
        return tracked.matcher
