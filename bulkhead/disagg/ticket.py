"""The admission ticket on the wire: signed by the router, verified by workers.

The types are the protocol's (bulkhead.protocol.ticket), the ones the model
checker explores; here are their JSON form and the HMAC under the cluster
key. The ticket carries the `Admitted` decision itself, the tenant's share
(weight, KV share: the workers' fair queue and quotas need no keys.toml) and
any LoRA adapter's name, path and digest, all signed. Workers verify it and
re-check it against their own limits (a mismatch means the pairing gate
failed: the request fails closed); they never decide admission again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import asdict

from bulkhead.engine.admission import AdapterRef, Admitted
from bulkhead.engine.request import SamplingParams
from bulkhead.protocol.ticket import SignedTicket, Ticket


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


def ticket_to_dict(ticket: Ticket) -> dict:
    """The wire form of a ticket (flat: the decision's fields, room, epoch, share)."""
    a = ticket.admitted
    return {"request_id": a.request_id, "tenant": a.tenant, "room": ticket.room, "epoch": ticket.epoch,
            "prompt_token_ids": list(a.prompt_token_ids), "params": params_to_dict(a.params),
            "context_length": a.context_length, "cache_salt": a.cache_salt, "client_id": a.client_id,
            "adapter": asdict(a.adapter) if a.adapter is not None else None,
            "weight": ticket.weight, "kv_share": ticket.kv_share}


def ticket_from_dict(d: dict) -> Ticket:
    adapter = d["adapter"]
    admitted = Admitted(d["request_id"], d["tenant"], tuple(int(t) for t in d["prompt_token_ids"]),
                        params_from_dict(d["params"]), int(d["context_length"]), d["cache_salt"], d["client_id"],
                        AdapterRef(str(adapter["name"]), str(adapter["path"]), str(adapter["digest"]))
                        if adapter is not None else None)
    share = d["kv_share"]
    return Ticket(admitted, int(d["room"]), int(d["epoch"]), float(d["weight"]),
                  None if share is None else float(share))


def signed_ticket_to_dict(signed: SignedTicket) -> dict:
    return {**ticket_to_dict(signed.ticket), "mac": signed.mac}


def signed_ticket_from_dict(d: dict) -> SignedTicket:
    return SignedTicket(ticket_from_dict(d), d["mac"])


def _mac(key: bytes, ticket: Ticket) -> str:
    body = json.dumps(ticket_to_dict(ticket), separators=(",", ":"), sort_keys=True).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def sign(ticket: Ticket, key: bytes) -> SignedTicket:
    """The router's signature over the ticket's canonical JSON."""
    return SignedTicket(ticket, _mac(key, ticket))


def verify(signed: SignedTicket, key: bytes, context_length: int) -> Ticket:
    """The ticket, once its signature verifies and it fits this worker's own
    context (a re-check: a mismatch means the pairing gate failed, and the
    request fails closed); else TicketError."""
    ticket = signed.ticket
    if not hmac.compare_digest(_mac(key, ticket), signed.mac):
        raise TicketError(f"ticket for {ticket.request_id} has a bad signature")
    a = ticket.admitted
    total = len(a.prompt_token_ids) + a.params.max_tokens
    if total > context_length or a.context_length > context_length:
        raise TicketError(
            f"ticket for {ticket.request_id} admits {total} tokens against {a.context_length}, "
            f"but this worker holds {context_length}: the pair's limits differ"
        )
    return ticket
