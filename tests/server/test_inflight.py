"""The in-flight registry and the cancellation wrapper, without a server."""

import asyncio

import pytest

from bulkhead.errors import Conflict, InvalidRequest, NotFound, RequestCancelled
from bulkhead.server.inflight import InFlight, InFlightRequests, client_request_id, until_cancelled


def entry(tenant="alpha", rid="r1"):
    return InFlight(rid, tenant, "completions", 1, 3, stream=False)


def test_an_id_is_found_only_by_its_own_tenant():
    reg = InFlightRequests()
    mine = entry()
    reg.add(mine)
    assert reg.get("alpha", "r1") is mine
    with pytest.raises(NotFound) as other:
        reg.get("beta", "r1")
    with pytest.raises(NotFound) as unknown:
        reg.get("beta", "r2")
    assert other.value.to_dict() == {"error": {**unknown.value.to_dict()["error"], "message": other.value.message}}
    reg.remove(mine)
    with pytest.raises(NotFound):
        reg.get("alpha", "r1")


def test_an_id_is_unique_within_a_tenant_only():
    reg = InFlightRequests()
    reg.add(entry("alpha"))
    reg.add(entry("beta"))  # the same name in another tenant's space
    with pytest.raises(Conflict):
        reg.add(entry("alpha"))
    assert len(reg) == 2


@pytest.mark.parametrize("header", ["", "a b", "x" * 65, "é", "a/b"])
def test_client_ids_are_short_and_plain(header):
    with pytest.raises(InvalidRequest):
        client_request_id(header)


def test_cancel_raises_a_typed_error_and_closes_the_source():
    closed = []

    async def source():
        try:
            yield 1
            await asyncio.sleep(3600)  # an engine that would never answer again
            yield 2
        finally:
            closed.append(True)  # where a backend aborts its engine requests

    async def main():
        cancelled = asyncio.Event()
        got = []
        with pytest.raises(RequestCancelled):
            async for item in until_cancelled(source(), cancelled):
                got.append(item)
                asyncio.get_running_loop().call_later(0.01, cancelled.set)
        return got

    assert asyncio.run(main()) == [1]
    assert closed == [True]


def test_an_uncancelled_source_runs_to_its_end():
    async def source():
        for i in range(3):
            yield i

    async def main():
        return [i async for i in until_cancelled(source(), asyncio.Event())]

    assert asyncio.run(main()) == [0, 1, 2]
