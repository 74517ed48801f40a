"""Every handler of the running router and workers, and the transition
functions (bulkhead.protocol.*_job) each one calls: what `bulkhead verify`
reports its coverage against.

A handler is what the runtime does on one message or event. `methods` are
the runtime methods it runs (tests/verify/test_handler_table.py checks
that they exist, that their code calls exactly these transition functions,
and that every message a dispatch table takes is listed here). A handler
with no transition function changes no request's state: it relays a
message between workers (the model's network carries those directly) or
keeps the worker registry.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Handler:
    actor: str                  # "router", "prefill" or "decode"
    on: str                     # the message kind (bulkhead.protocol.messages) or runtime event
    methods: tuple[str, ...]    # the runtime methods that make it up
    transitions: tuple[str, ...] = ()  # "decode.finalize", ...
    why_none: str = ""          # for a handler with no transition: what it does instead


H = Handler
RELAY = "relays the message between the pair's workers; the model's network carries it directly"
REGISTRY_ONLY = "keeps the worker registry (liveness, limits); a lost or restarted worker is the tick's or register's"
DRAIN = ("drain state: a draining worker is assigned nothing new and finishes what it holds through the "
         "handlers above")

HANDLERS = (
    # -- router (bulkhead.disagg.router.DisaggBackend) --------------------------------
    # An admitted request's coroutine: assign, then its deadline or the client leaving.
    H("router", "request", ("generate", "_finalize", "_finalize_route"),
      ("router.submit", "router.bootstrap", "router.decide")),
    H("router", "heartbeat", ("_on_heartbeat",), why_none=REGISTRY_ONLY),
    H("router", "leaving", ("_on_leaving", "drain"), ("router.drain_worker",)),
    H("router", "operator drain", ("drain",), ("router.drain_worker",)),
    H("router", "register", ("_register", "_fail", "_finalize_route", "_deliver"),
      ("router.decide", "router.finished")),
    H("router", "pages_granted", ("_relay_grant",), why_none=RELAY),
    H("router", "prefill_ready", ("_relay_to_decode",), why_none=RELAY),
    H("router", "transfer_done", ("_relay_to_decode",), why_none=RELAY),
    H("router", "drain_ack", ("_relay_drain_ack",), why_none=RELAY),
    H("router", "output", ("_on_output", "_deliver"), ("router.finished",)),
    H("router", "prefill_failed", ("_on_prefill_failed", "_fail", "_finalize_route", "_deliver"),
      ("router.decide", "router.finished")),
    H("router", "transfer_failed", ("_on_transfer_failed", "_fail", "_finalize_route", "_deliver"),
      ("router.decide", "router.finished")),
    H("router", "worker lost (tick)", ("_on_tick", "_fail", "_finalize_route", "_deliver"),
      ("router.decide", "router.finished")),
    H("router", "worker unreachable", ("_undeliverable", "_fail", "_finalize_route", "_deliver"),
      ("router.decide", "router.finished")),
    # -- prefill (bulkhead.disagg.prefill_worker.PrefillWorker) -----------------------
    H("prefill", "assign", ("_on_assign",), ("prefill.assign",)),
    H("prefill", "pages_granted", ("_on_pages_granted", "_maybe_transfer"),
      ("prefill.pages_granted", "prefill.start_transfer")),
    H("prefill", "engine hand-over", ("_on_output", "_maybe_transfer", "_drained"),
      ("prefill.prefilled", "prefill.start_transfer", "prefill.quiesced")),
    H("prefill", "transfer ended", ("_transfer", "_drained", "_undrained"), ("prefill.quiesced", "prefill.undrained")),
    H("prefill", "finalize", ("_finalize", "_drained"), ("prefill.finalize", "prefill.quiesced")),
    H("prefill", "reregister", ("_on_reregister", "abandon_jobs", "_finalize", "_drained"),
      ("prefill.finalize", "prefill.quiesced")),
    H("prefill", "registered", ("_on_registered",), why_none=REGISTRY_ONLY),
    H("prefill", "refused", ("_on_refused",), why_none=REGISTRY_ONLY),
    H("prefill", "drain", ("_on_drain",), why_none=DRAIN),
    H("prefill", "resume", ("_on_resume",), why_none=DRAIN),
    # -- decode (bulkhead.disagg.decode_worker.DecodeWorker) --------------------------
    H("decode", "assign", ("_on_assign",), ("decode.assign",)),
    H("decode", "prefill_ready", ("_on_prefill_ready", "_grant_pending"), ("decode.wants_pages",)),
    H("decode", "pages reserved", ("_granted", "_fail", "_release_if_remembered_ack"),
      ("decode.pages_reserved", "decode.verdict", "decode.drain_ack")),
    H("decode", "transfer_done", ("_verify_and_commit",), ("decode.manifest_arrived",)),
    H("decode", "checks done", ("_checked", "_fail", "_release_if_remembered_ack"),
      ("decode.verdict", "decode.drain_ack")),
    H("decode", "engine output", ("_on_output",), ("decode.decode_step", "decode.finished")),
    H("decode", "finalize", ("_finalize",), ("decode.finalize",)),
    H("decode", "drain_ack", ("_on_drain_ack",), ("decode.drain_ack",)),
    H("decode", "tick", ("on_tick", "_grant_pending", "_lease_expired", "_fail", "_release_if_remembered_ack"),
      ("decode.wants_pages", "decode.lease_expired", "decode.verdict", "decode.drain_ack")),
    H("decode", "reregister", ("_on_reregister", "abandon_jobs", "_finalize"),
      ("decode.finalize",)),
    H("decode", "registered", ("_on_registered",), why_none=REGISTRY_ONLY),
    H("decode", "refused", ("_on_refused",), why_none=REGISTRY_ONLY),
    H("decode", "drain", ("_on_drain",), why_none=DRAIN),
    H("decode", "resume", ("_on_resume",), why_none=DRAIN),
)
