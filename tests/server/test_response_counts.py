"""/metrics counts every response by status and reason, refusals included,
with a tenant label only where the key was valid (issue 16 item 4)."""

import httpx
import pytest

from bulkhead.server.app import MAX_BODY_BYTES
from tests.server.tiny_server import ALPHA
from tests.server_process import OPERATOR_HEADERS

ALPHA_AUTH = {"Authorization": f"Bearer {ALPHA}"}
COMPLETIONS = "/v1/completions"

# (what is sent, the (tenant, endpoint, status, reason) it must be counted under)
REFUSALS = [
    (dict(json={"prompt": "hi", "max_tokens": 1}), ("", COMPLETIONS, "401", "invalid_api_key")),
    (dict(json={"prompt": "hi", "max_tokens": 1}, headers={"Authorization": "Bearer sk-wrong"}),
     ("", COMPLETIONS, "401", "invalid_api_key")),
    (dict(json={"prompt": "hi", "model": "no-such-model"}, headers=ALPHA_AUTH),
     ("alpha", COMPLETIONS, "404", "model_not_found")),
    (dict(content=b'{"prompt": "hi",', headers={**ALPHA_AUTH, "Content-Type": "application/json"}),
     ("", COMPLETIONS, "400", "invalid_json")),
    (dict(json={"prompt": "hi", "foo_bar": 1}, headers=ALPHA_AUTH),
     ("alpha", COMPLETIONS, "400", "unsupported_parameter")),
    (dict(json={"prompt": "hi", "max_tokens": 0}, headers=ALPHA_AUTH), ("alpha", COMPLETIONS, "400", "invalid_value")),
    (dict(content=b"x" * (MAX_BODY_BYTES + 1), headers={**ALPHA_AUTH, "Content-Type": "application/json"}),
     ("", "unmatched", "413", "body_too_large")),
]


def counted(server, tenant, endpoint, status, reason) -> float:
    return server.metric("bulkhead_http_responses_total", tenant=tenant, endpoint=endpoint, status=status,
                         reason=reason)


@pytest.mark.parametrize("request_kw,labels", REFUSALS, ids=[f"{s}-{r}" for _, (_, _, s, r) in REFUSALS])
def test_every_refusal_is_counted_by_status_and_reason(tiny_server, request_kw, labels):
    before = counted(tiny_server, *labels)
    r = httpx.post(tiny_server.url + COMPLETIONS, timeout=60, **request_kw)
    assert r.status_code == int(labels[2]), r.text
    assert counted(tiny_server, *labels) == before + 1


def test_an_unknown_path_is_counted_without_its_path_and_a_success_as_ok(tiny_server):
    before = counted(tiny_server, "", "unmatched", "404", "not_found")
    assert httpx.get(tiny_server.url + "/v1/no-such-thing-4711", headers=ALPHA_AUTH).status_code == 404
    assert counted(tiny_server, "", "unmatched", "404", "not_found") == before + 1
    assert "no-such-thing-4711" not in httpx.get(tiny_server.url + "/metrics", headers={
        **OPERATOR_HEADERS}).text  # a client cannot grow the label set
    ok = counted(tiny_server, "alpha", "/v1/models", "200", "ok")
    assert httpx.get(tiny_server.url + "/v1/models", headers=ALPHA_AUTH).status_code == 200
    assert counted(tiny_server, "alpha", "/v1/models", "200", "ok") == ok + 1
