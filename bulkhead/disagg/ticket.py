"""The admission ticket: the router's one decision, signed, checked by workers.

A SignedTicket is the `Admitted` value that `engine.admission.admit()`
returned, with the room and epoch the router bootstrapped it in and an HMAC
under the cluster key: the decision crosses the process boundary as itself
(one form, and `max_tokens` only once, in its sampling parameters). Workers
verify the signature and that the ticket is consistent with their own live
limits (a re-check: a mismatch means the pairing gate failed, and the request
fails closed); they never decide admission again.

It also carries the tenant's share as the router's tenant table had it at
admission (weight, KV share): the workers schedule by it (fair queue, KV
quotas) without a copy of keys.toml, and a reload reaches them with the
next request. Signed, so a worker can trust it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import asdict, dataclass, replace

from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import SamplingParams


class TicketError(RuntimeError):
    pass


def params_to_dict(p: SamplingParams) -> dict:
    d = asdict(p)
    d["logit_bias"] = [list(x) for x in p.logit_bias]
    return d


def params_from_dict(d: dict) -> SamplingParams:
    return SamplingParams(**{
        **d,
        "stop": tuple(d["stop"]),
        "stop_token_ids": tuple(d["stop_token_ids"]),
        "logit_bias": tuple((int(t), float(b)) for t, b in d["logit_bias"]),
    })


@dataclass(frozen=True)
class SignedTicket:
    admitted: Admitted
    room: int
    epoch: int
    mac: str = ""
    weight: float = 1.0             # the tenant's fair-share weight (> 0)
    kv_share: float | None = None   # its KV pool fraction; None = the fair share of active tenants

    @property
    def request_id(self) -> str:
        return self.admitted.request_id

    @property
    def tenant(self) -> str:
        return self.admitted.tenant

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return self.admitted.prompt_token_ids

    def _body(self) -> bytes:
        fields = self.to_dict()
        fields.pop("mac")
        return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()

    def signed(self, key: bytes) -> SignedTicket:
        return replace(self, mac=hmac.new(key, self._body(), hashlib.sha256).hexdigest())

    def verify(self, key: bytes, context_length: int) -> None:
        expected = hmac.new(key, self._body(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self.mac):
            raise TicketError(f"ticket for {self.request_id} has a bad signature")
        a = self.admitted
        total = len(a.prompt_token_ids) + a.params.max_tokens
        if total > context_length or a.context_length > context_length:
            raise TicketError(
                f"ticket for {self.request_id} admits {total} tokens against {a.context_length}, "
                f"but this worker holds {context_length}: the pair's limits differ"
            )

    def to_dict(self) -> dict:
        a = self.admitted
        return {"request_id": a.request_id, "tenant": a.tenant, "room": self.room, "epoch": self.epoch,
                "prompt_token_ids": list(a.prompt_token_ids), "params": params_to_dict(a.params),
                "context_length": a.context_length, "cache_salt": a.cache_salt, "mac": self.mac,
                "weight": self.weight, "kv_share": self.kv_share}

    @classmethod
    def from_dict(cls, d: dict) -> SignedTicket:
        admitted = Admitted(d["request_id"], d["tenant"], tuple(int(t) for t in d["prompt_token_ids"]),
                            params_from_dict(d["params"]), int(d["context_length"]), d["cache_salt"])
        share = d["kv_share"]
        return cls(admitted, int(d["room"]), int(d["epoch"]), d["mac"], float(d["weight"]),
                   None if share is None else float(share))
