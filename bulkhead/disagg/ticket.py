"""The admission ticket: the router's one decision, signed, checked by workers.

Workers verify the signature and that the ticket is consistent with their
own live limits (a re-check: a mismatch means the pairing gate failed, and
the request fails closed); they never decide admission again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import asdict, dataclass


class TicketError(RuntimeError):
    pass


@dataclass(frozen=True)
class SignedTicket:
    request_id: str
    tenant: str
    room: int
    epoch: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    context_length: int  # the limit the router admitted against
    params: dict  # SamplingParams fields
    cache_salt: str | None = None  # the client's; subdivides the tenant's prefix-cache space
    mac: str = ""

    def _body(self) -> bytes:
        fields = asdict(self)
        fields.pop("mac")
        return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()

    def signed(self, key: bytes) -> SignedTicket:
        from dataclasses import replace

        return replace(self, mac=hmac.new(key, self._body(), hashlib.sha256).hexdigest())

    def verify(self, key: bytes, context_length: int) -> None:
        expected = hmac.new(key, self._body(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self.mac):
            raise TicketError(f"ticket for {self.request_id} has a bad signature")
        total = len(self.prompt_token_ids) + self.max_tokens
        if total > context_length or self.context_length > context_length:
            raise TicketError(
                f"ticket for {self.request_id} admits {total} tokens against {self.context_length}, "
                f"but this worker holds {context_length}: the pair's limits differ"
            )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prompt_token_ids"] = list(self.prompt_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SignedTicket:
        return cls(**{**d, "prompt_token_ids": tuple(d["prompt_token_ids"])})
