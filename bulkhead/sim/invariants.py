"""What must hold after every seed, whatever the faults did.

    kind                   | property
    -----------------------+----------------------------------------------------------
    foreign_read           | every read (prefill or decode) sees only its own request's KV
    write_on_moved_page    | no write lands on a page no longer the writer's at its generation
    ledger_integrity       | every engine's ledger and scheduler agree after every step
    runtime_error          | no worker or router handler raised
    illegal_transition     | no job took a step outside its lifecycle table (counted by
                           | each live worker as it fails the request closed)
    no_outcome             | every request got exactly one terminal outcome at its client
    two_outcomes           |   (never none, never two)
    rejected_not_clean     | an over-length request reached no worker (no message names it)
    success_not_decoded    | a 200 carries exactly what decode produced from verified KV
    outcome_disagreement   | an unsuccessful admitted request was finalized at both workers
                           | with one outcome; a success was never finalized
    decode_after_finalize  | no decode worker reports success after it was told otherwise
    pages_held             | in the end no worker holds a page (liveness: see LIVENESS)
    jobs_left              | in the end no worker tracks a request (liveness: see LIVENESS)
    free_page_dirty        | every free page is scrubbed (all zero) in the end

LIVENESS kinds need every control message to arrive: nothing in the runtime
retransmits one (the model checker assumes retransmission, docs/verification.md),
so in a seed where a message was really lost (drop, or an overtaken message
that the replay check then drops) they are reported as findings, not
violations. Every other kind is a violation under every fault.
"""

from __future__ import annotations

from bulkhead.sim.client import Outcome, SimRequest
from bulkhead.sim.cluster import Cluster
from bulkhead.sim.context import SimContext

SUCCESS = ("length", "stop")
LIVENESS = ("no_outcome", "pages_held", "jobs_left")


def check_run(ctx: SimContext, cluster: Cluster, requests: list[SimRequest], outcomes: dict[str, Outcome],
              quiescent: bool) -> None:
    canaries = {r.canary: r for r in requests}
    for t, worker, canary, pos, k, v in ctx.bad_reads:
        owner = canaries.get(int(k)) if k == k else None  # NaN != NaN
        seen = f"request {owner.request_id}'s KV" if owner else f"K={k} V={v} (never written for it)"
        reader = canaries[canary].request_id if canary in canaries else f"canary {canary}"
        ctx.violation("foreign_read", f"{worker}: {reader} read position {pos} holding {seen}")
    for req in requests:
        _check_request(ctx, req, outcomes[req.request_id])
    if not quiescent:
        _check_left_over(ctx, cluster)
    for node in cluster.live_workers():
        if illegal := node.worker.counters.get("illegal_transitions"):
            ctx.violation("illegal_transition", f"{node.name}: {illegal} steps outside the lifecycle table")
        engine = node.worker.engine
        try:
            engine.check_integrity()
        except Exception as e:
            ctx.violation("ledger_integrity", f"{node.name} at the end: {e}")
        ledger = engine.ledger
        free = [p for p in range(ledger.num_pages) if ledger.record(p).owner is None and not ledger.record(p).dirty]
        dirty = [p for p in free if bool(engine.pool.data[p].any())]
        if dirty:
            ctx.violation("free_page_dirty", f"{node.name} free pages {dirty} hold KV")


def _check_left_over(ctx: SimContext, cluster: Cluster) -> None:
    """Once every client has its answer and leases and backstops have run out,
    no worker may still hold pages (pages_held) or requests (jobs_left)."""
    if len(cluster.live_workers()) != len(cluster.nodes):
        ctx.violation("pages_held", "a worker never came back")
    for n in cluster.live_workers():
        ledger = n.worker.engine.ledger
        if ledger.num_free != ledger.num_pages:
            owners = sorted({ledger.record(p).owner for p in range(ledger.num_pages)} - {None})
            ctx.violation("pages_held", f"{n.name} still holds {ledger.num_pages - ledger.num_free} pages "
                                        f"of {owners}; jobs {sorted(n.worker.jobs)}")
        elif n.worker.jobs:
            ctx.violation("jobs_left", f"{n.name} still tracks {sorted(n.worker.jobs)} (no pages)")


def _check_request(ctx: SimContext, req: SimRequest, out: Outcome) -> None:
    rid = req.request_id
    if out.terminal_events == 0:
        ctx.violation("no_outcome", f"{rid}: the client got no answer")
        return
    if out.terminal_events > 1:
        ctx.violation("two_outcomes", f"{rid}: {out.terminal_events} terminal outputs")
    mentions = [(src, dst, m) for _, src, dst, m in ctx.sent if _names(m) == rid]
    if out.kind == "rejected":
        if mentions:
            ctx.violation("rejected_not_clean", f"{rid} was rejected ({out.code}) yet {len(mentions)} messages "
                                                f"name it, first {mentions[0][2].get('kind')}")
        return
    assigned = {dst for src, dst, m in mentions if src == "router" and m.get("kind") == "assign"}
    finalized = [(dst, m.get("outcome")) for src, dst, m in mentions if src == "router" and m.get("kind") == "finalize"]
    decoded = [m["output"] for src, dst, m in mentions if m.get("kind") == "output"]
    if out.kind == "success":
        produced = [t for o in decoded for t in o["token_ids"]]
        finish = [o["finish_reason"] for o in decoded if o["finished"]]
        if finish[-1:] != [out.code] or not set(out.tokens) <= {req.canary} or not _subsequence(out.tokens, produced):
            ctx.violation("success_not_decoded", f"{rid}: client got {out.tokens} ({out.code}); decode sent "
                                                 f"{produced} ({finish})")
        elif out.tokens != produced:
            ctx.stats["success_with_stream_gap"] += 1  # a lost or overtaken output: see docs
        if finalized:
            ctx.violation("outcome_disagreement", f"{rid}: succeeded yet finalized as {finalized}")
        return
    if assigned:
        outcomes = {o for _, o in finalized}
        if {dst for dst, _ in finalized} != assigned or len(outcomes) != 1 or len(finalized) != len(assigned):
            ctx.violation("outcome_disagreement", f"{rid}: client {out.kind} {out.code}; assigned to "
                                                  f"{sorted(assigned)}, finalize sent {finalized}")
        told = [t for t, dst, m in ctx.delivered if m.get("kind") == "finalize" and m.get("request_id") == rid
                and dst.startswith("decode")]
        late = [t for t, src, dst, m in ctx.sent if m.get("kind") == "output" and _names(m) == rid
                and m["output"]["finished"] and m["output"]["finish_reason"] in SUCCESS and told and t > told[0]]
        if late:
            ctx.violation("decode_after_finalize", f"{rid}: decode reported success after its finalize")
        if any(o["finished"] and o["finish_reason"] in SUCCESS for o in decoded):
            ctx.stats["decoded_but_failed_at_router"] += 1  # the router's outcome stands (e.g. output lost)


def _names(message: dict) -> str | None:
    if message.get("kind") == "output":
        return message["output"]["request_id"]
    return message.get("request_id")


def _subsequence(small: list[int], big: list[int]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)
