"""GET and DELETE /v1/requests/{id}: only the tenant that sent a request can see or cancel it."""

import json
import threading
import uuid

import httpx
import pytest

from tests.server.tiny_server import ALPHA, BETA

LONG = {"prompt": "Tell me a long story.", "max_tokens": 8000, "ignore_eos": True}


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def data_lines(lines):
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


@pytest.fixture
def running_stream(tiny_server):
    """Alpha's streamed request, decoding: (its id, the rest of its stream as an iterator)."""
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json={**LONG, "stream": True},
                      headers=auth(ALPHA), timeout=120) as r:
        assert r.status_code == 200
        chunks = data_lines(r.iter_lines())
        first = next(chunks)
        assert first["id"] == r.headers["x-request-id"]
        yield first["id"], chunks


def test_another_tenant_cannot_read_or_cancel_a_request_and_its_owner_can(tiny_server, running_stream):
    rid, chunks = running_stream
    url = f"{tiny_server.url}/v1/requests/{rid}"
    unknown = httpx.get(f"{tiny_server.url}/v1/requests/cmpl-{uuid.uuid4().hex[:24]}", headers=auth(BETA))
    for r in (httpx.get(url, headers=auth(BETA)), httpx.delete(url, headers=auth(BETA))):
        assert r.status_code == 404
        err = r.json()["error"]
        # Exactly what an unknown id gets, so beta cannot tell that the id exists.
        assert err["code"] == unknown.json()["error"]["code"] == "request_not_found"
        assert err["type"] == "invalid_request_error" and err["param"] == "request_id"
    mine = httpx.get(url, headers=auth(ALPHA))
    assert mine.status_code == 200, mine.text
    view = mine.json()
    assert view["id"] == rid and view["state"] in ("queued", "running") and view["stream"] is True
    assert "prompt" not in view and "text" not in view  # ids and counts only

    scrubbed = tiny_server.metric("bulkhead_kv_pages_scrubbed_total")
    cancel = httpx.delete(url, headers=auth(ALPHA), timeout=30)
    assert cancel.status_code == 200 and cancel.json()["state"] == "cancelled", cancel.text
    rest = list(chunks)
    assert rest[-1]["error"]["code"] == "cancelled"  # the stream ends with a typed error, no [DONE]
    # Beta's attempts changed nothing: the request ran until alpha cancelled it, well short of its 8000 tokens.
    assert cancel.json()["completion_tokens"] < LONG["max_tokens"]
    info = tiny_server.wait_idle()
    assert info["owned_pages"] == 0 and info["dirty_pages"] == 0
    assert tiny_server.metric("bulkhead_kv_pages_scrubbed_total") > scrubbed
    assert httpx.get(url, headers=auth(ALPHA)).status_code == 404  # gone once ended


def test_a_non_streamed_request_is_cancelled_by_its_client_id(tiny_server):
    rid = f"job-{uuid.uuid4().hex[:8]}"
    url = f"{tiny_server.url}/v1/requests/{rid}"
    result = {}

    def post():
        result["r"] = httpx.post(tiny_server.url + "/v1/completions", json=LONG,
                                 headers={**auth(ALPHA), "X-Request-Id": rid}, timeout=120)

    worker = threading.Thread(target=post)
    worker.start()
    try:
        view = _wait_until_running(url)
        assert view["stream"] is False
        # The same id again from the same tenant is refused while the first is in flight; beta may use it.
        dup = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                         headers={**auth(ALPHA), "X-Request-Id": rid})
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "duplicate_request_id"
        assert tiny_server.metric("bulkhead_http_responses_total", tenant="alpha", endpoint="/v1/completions",
                                  status="409", reason="duplicate_request_id") >= 1  # refusals are counted too
        other = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                           headers={**auth(BETA), "X-Request-Id": rid})
        assert other.status_code == 200 and other.json()["id"] == rid
        assert httpx.delete(url, headers=auth(ALPHA), timeout=30).json()["state"] == "cancelled"
    finally:
        worker.join(timeout=120)
    r = result["r"]
    assert r.status_code == 499 and r.json()["error"]["code"] == "cancelled", r.text
    assert tiny_server.wait_idle()["owned_pages"] == 0


def _wait_until_running(url: str) -> dict:
    """Poll (bounded) until the request has produced a token."""
    for _ in range(600):
        r = httpx.get(url, headers=auth(ALPHA))
        if r.status_code == 200 and r.json()["state"] == "running":
            return r.json()
        threading.Event().wait(0.05)
    raise AssertionError(f"request never ran: {r.text}")
