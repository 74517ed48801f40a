"""When a request ends, and which of its text the client may see yet."""

from __future__ import annotations

from bulkhead.engine.request import FinishReason, Request
from bulkhead.model.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputTracker:
    """Per-request text state: detokenizes, finds stop strings, holds back text
    that might turn out to be the start of a stop string."""

    def __init__(self, tokenizer: Tokenizer, req: Request, eos_token_ids: tuple[int, ...]):
        self.req = req
        self.detok = IncrementalDetokenizer(tokenizer)
        self.emitted = 0  # characters of detok.text already sent
        self._holdback = max((len(s) for s in req.params.stop), default=1) - 1
        p = req.params
        self._stop_ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))

    def push(self, token_id: int) -> tuple[str, FinishReason | None]:
        """Take one sampled token; returns (text the client may now see, finish reason or None)."""
        p = self.req.params
        n_out = len(self.req.output_token_ids)
        may_stop = n_out >= p.min_tokens
        if token_id in self._stop_ids and may_stop:
            return self._flush(len(self.detok.text)), FinishReason.STOP
        self.detok.push(token_id)
        text = self.detok.text
        if p.stop and may_stop:
            window_start = max(0, self.emitted - self._holdback)
            hits = [i for i in (text.find(s, window_start) for s in p.stop) if i >= 0]
            if hits:
                return self._flush(min(hits)), FinishReason.STOP
        if n_out >= p.max_tokens:
            return self._flush(len(text)), FinishReason.LENGTH
        return self._flush(max(self.emitted, len(text) - self._holdback)), None

    def _flush(self, upto: int) -> str:
        delta = self.detok.text[self.emitted : upto]
        self.emitted = max(self.emitted, upto)
        return delta

    @property
    def text(self) -> str:
        return self.detok.text[: self.emitted]
