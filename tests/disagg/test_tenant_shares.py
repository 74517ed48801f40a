"""The tenant table reaches the workers of a disaggregated deployment:
each signed ticket carries its tenant's weight and KV share, the workers'
fair queues and KV quotas read them, decode grants pages in fair order, and
the router reports per-tenant state summed over its workers."""
import asyncio
from concurrent.futures import Future
from dataclasses import replace

import pytest

from bulkhead.disagg import messages as m
from bulkhead.disagg.decode_worker import DecodeJob, DecodeWorker
from bulkhead.disagg.router import DisaggBackend
from bulkhead.disagg.router_metrics import sum_tenant_stats
from bulkhead.disagg.signing import Signer
from bulkhead.disagg.ticket import TicketError, sign, signed_ticket_from_dict, signed_ticket_to_dict, verify
from bulkhead.protocol.lifecycle import Event
from bulkhead.seams import Seams
from tests.disagg.test_decode_guard import FakeTarget
from tests.disagg.test_messages import RecordingLink, RecordingRouterLink
from tests.disagg.tickets import make_ticket

KEY = b"k" * 32


def test_a_ticket_carries_its_tenants_share_under_the_signature():
    ticket = sign(replace(make_ticket(), weight=3.0, kv_share=0.25), KEY)
    again = signed_ticket_from_dict(signed_ticket_to_dict(ticket))
    assert again == ticket
    verify(again, KEY, 100)
    with pytest.raises(TicketError):  # a share changed on the way is a forgery
        verify(replace(ticket, ticket=replace(ticket.ticket, weight=100.0)), KEY, 100)


@pytest.fixture
def decode(make_engine):
    signer = Signer(KEY, "decode-0")
    return DecodeWorker(make_engine(), "tiny", signer, "tcp://127.0.0.1:1", target=FakeTarget(),
                        seams=Seams(make_link=RecordingLink))


def test_a_worker_schedules_by_the_share_its_ticket_carries(decode):
    """The link thread writes nothing the scheduler reads: the share reaches
    the engine as a command, in force once the engine thread takes it."""
    before = decode.engine.scheduler.shares
    ticket = sign(replace(make_ticket(tenant="alpha"), weight=3.0, kv_share=0.25), KEY)
    decode.on_message(m.encode(m.Assign("r1", ticket)))
    assert "r1" in decode.jobs
    assert (before.weight("alpha"), before.kv_share("alpha")) == (1.0, None)  # not yet: still queued
    decode.engine.run_once()
    shares = decode.engine.scheduler.shares
    assert (shares.weight("alpha"), shares.kv_share("alpha")) == (3.0, 0.25)
    assert (shares.weight("beta"), shares.kv_share("beta")) == (1.0, None)


def test_decode_grants_pages_to_the_least_served_tenant_first(decode, monkeypatch):
    for rid, tenant in (("heavy-1", "heavy"), ("heavy-2", "heavy"), ("light-1", "light")):
        job = DecodeJob(make_ticket(request_id=rid, tenant=tenant))
        job.advance(Event.ASSIGN)
        decode.jobs[rid] = job
        decode.pending.append(rid)
    decode.engine.scheduler.waiting.counters.update({"heavy": 500.0, "light": 10.0})
    asked = []

    def reserve(rid, tenant, n):
        asked.append(rid)
        return Future()  # never completes: only the order matters here

    monkeypatch.setattr(decode.engine, "reserve_pages", reserve)
    decode._grant_pending()
    # The link thread read nothing of the live fair queue: no snapshot yet, arrival order.
    assert asked == ["heavy-1", "heavy-2", "light-1"]
    asked.clear()
    decode.pending.extend(["heavy-1", "heavy-2", "light-1"])
    decode.channel.refresh()
    decode.engine.run_once()  # the engine thread publishes its counters
    decode._grant_pending()
    assert asked == ["light-1", "heavy-1", "heavy-2"]  # fair first, then arrival order


def test_the_router_signs_the_tenant_tables_share_into_each_ticket(make_engine):
    workers = [DecodeWorker(make_engine(), "tiny", Signer(KEY, "decode-0"), "tcp://127.0.0.1:1",
                            target=FakeTarget(), seams=Seams(make_link=RecordingLink))]
    from bulkhead.disagg.prefill_worker import PrefillWorker

    workers.append(PrefillWorker(make_engine(), "tiny", Signer(KEY, "prefill-0"), "tcp://127.0.0.1:1",
                                 seams=Seams(make_link=RecordingLink)))
    router = DisaggBackend(None, "tiny", Signer(KEY, "router"), "tcp://127.0.0.1:1", "api_keys",
                           make_link=RecordingRouterLink)
    for w in workers:
        router._register(w.name, m.Register(w.info(), w.transfer_endpoint()), "inc-1")
    router.set_tenant_shares(lambda t: 4.0 if t == "alpha" else 1.0, lambda t: 0.5)

    async def assign_one():
        updates = router.generate([make_ticket(request_id="r9", tenant="alpha").admitted])
        step = asyncio.ensure_future(updates.__anext__())
        await asyncio.sleep(0.05)
        step.cancel()

    asyncio.run(assign_one())
    assigns = [m.decode(body) for _, body in router.link.sent if body["kind"] == "assign"]
    assert len(assigns) == 2
    assert {(a.ticket.ticket.weight, a.ticket.ticket.kv_share) for a in assigns} == {(4.0, 0.5)}


def test_the_routers_tenant_view_sums_its_workers():
    prefill = {"alpha": {"service": 10.0, "waiting": 1, "kv_pages": 4, "kv_quota": 8}}
    decode = {"alpha": {"service": 5.5, "waiting": 0, "kv_pages": 2, "kv_quota": None},
              "beta": {"service": 1.0, "waiting": 2, "kv_pages": 0, "kv_quota": None}}
    total = sum_tenant_stats([prefill, decode])
    assert total["alpha"] == {"service": 15.5, "waiting": 1, "kv_pages": 6, "kv_quota": 8}
    assert total["beta"] == {"service": 1.0, "waiting": 2, "kv_pages": 0, "kv_quota": None}
