"""Bad input against a live server: each case gets a typed 4xx in the OpenAI
error shape (status, code, param, and limit/value where a limit was broken)
before any KV page is allocated (the ledger's allocation counter does not move)."""

import socket

import httpx
import pytest

from tests.server.tiny_server import ALPHA, BETA, LONG_CONTEXT

VOCAB = 49152  # SmolLM2's tokenizer, which the tiny model shares
MAX_INPUT = LONG_CONTEXT - 1  # one token must be generated
MAX_BODY = 16 * 2**20

CHAT = [{"role": "user", "content": "hi"}]
# (case id, path, JSON body or raw bytes, status, code, param, limit, value); limit/value None = absent
CASES = [
    ("prompt over the context", "/v1/completions", {"prompt": [1] * LONG_CONTEXT, "max_tokens": 1},
     400, "context_length_exceeded", "prompt", MAX_INPUT, LONG_CONTEXT),
    ("text prompt over the context", "/v1/completions", {"prompt": "hello " * (LONG_CONTEXT + 10)},
     400, "context_length_exceeded", "prompt", MAX_INPUT, ...),
    ("prompt + max_tokens over the context", "/v1/completions", {"prompt": [1] * 100, "max_tokens": 8093},
     400, "context_length_exceeded", "max_tokens", LONG_CONTEXT, 8193),
    ("chat prompt + max_completion_tokens over", "/v1/chat/completions",
     {"messages": CHAT, "max_completion_tokens": LONG_CONTEXT}, 400, "context_length_exceeded", "max_tokens",
     LONG_CONTEXT, ...),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "invalid_value", "max_tokens", 1, 0),
    ("max_tokens negative", "/v1/completions", {"prompt": "hi", "max_tokens": -7}, 400, "invalid_value",
     "max_tokens", 1, -7),
    ("chat max_completion_tokens 0", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0},
     400, "invalid_value", "max_tokens", 1, 0),
    ("token prompt out of vocabulary", "/v1/completions", {"prompt": [1, VOCAB]}, 400, "invalid_token_id", "prompt",
     VOCAB - 1, VOCAB),
    ("token prompt negative id", "/v1/completions", {"prompt": [[1, 2], [-1]]}, 400, "invalid_token_id", "prompt",
     VOCAB - 1, -1),
    ("stop_token_ids out of vocabulary", "/v1/completions", {"prompt": "hi", "stop_token_ids": [10**9]},
     400, "invalid_token_id", "stop_token_ids", VOCAB - 1, 10**9),
    ("stop_token_ids negative", "/v1/chat/completions", {"messages": CHAT, "stop_token_ids": [-3]},
     400, "invalid_token_id", "stop_token_ids", VOCAB - 1, -3),
    ("logit_bias out of vocabulary", "/v1/completions", {"prompt": "hi", "logit_bias": {str(VOCAB): 5}},
     400, "invalid_token_id", "logit_bias", VOCAB - 1, VOCAB),
    ("logit_bias negative id", "/v1/completions", {"prompt": "hi", "logit_bias": {"-1": 5}},
     400, "invalid_token_id", "logit_bias", VOCAB - 1, -1),
    ("logit_bias value over 100", "/v1/completions", {"prompt": "hi", "logit_bias": {"5": 1e9}},
     400, "invalid_value", "logit_bias", 100, 1e9),
    ("huge n", "/v1/completions", {"prompt": "hi", "n": 10**12}, 400, "invalid_value", "n", 16, 10**12),
    ("n zero", "/v1/chat/completions", {"messages": CHAT, "n": 0}, 400, "invalid_value", "n", 16, 0),
    ("prompts x n over the cap", "/v1/completions", {"prompt": ["a"] * 5, "n": 16}, 400, "invalid_value", "prompt",
     64, 80),
    ("huge top_logprobs", "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 10**6},
     400, "invalid_value", "top_logprobs", 20, 10**6),
    ("huge completion logprobs", "/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "invalid_value",
     "logprobs", 20, 21),
    ("non-finite temperature", "/v1/completions", b'{"prompt": "hi", "temperature": Infinity}',
     400, "invalid_value", "temperature", 2.0, "inf"),
    ("seed beyond int64", "/v1/completions", {"prompt": "hi", "seed": 2**64}, 400, "invalid_value", "seed",
     2**63 - 1, 2**64),
    ("lone surrogate in a prompt", "/v1/completions", b'{"prompt": "a\\ud800b"}', 400, "invalid_unicode", "prompt",
     None, None),
    ("lone surrogate in chat content", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}', 400, "invalid_unicode",
     "messages", None, None),
    ("lone surrogate in cache_salt", "/v1/completions", b'{"prompt": "hi", "cache_salt": "\\ud800"}', 400,
     "invalid_unicode", "cache_salt", None, None),
    ("malformed JSON", "/v1/completions", b'{"prompt": "hi"', 400, "invalid_json", None, None, None),
    ("empty body", "/v1/chat/completions", b"", 400, "missing_parameter", None, None, None),
    ("body is not an object", "/v1/completions", b"[1, 2]", 400, "invalid_type", None, None, None),
    ("wrong type: max_tokens string", "/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400,
     "invalid_type", "max_tokens", None, None),
    ("wrong type: prompt number", "/v1/completions", {"prompt": 5}, 400, "invalid_type", "prompt", None, None),
    ("wrong type: message content", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "invalid_type", "messages.0.content", None, None),
    ("wrong role", "/v1/chat/completions", {"messages": [{"role": "root", "content": "hi"}]}, 400,
     "invalid_type", "messages.0.role", None, None),
    ("missing prompt", "/v1/completions", {"max_tokens": 3}, 400, "missing_parameter", "prompt", None, None),
    ("empty messages", "/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages", None, None),
    ("empty token prompt", "/v1/completions", {"prompt": [[]]}, 400, "empty_prompt", "prompt", None, None),
    ("invalid UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe hi"}', 400, "invalid_utf8", None, None, None),
    ("unknown model", "/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model_not_found", "model",
     None, None),
    ("bad X-Request-Id", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "_headers": {"X-Request-Id": "a b"}},
     400, "invalid_request_id", "X-Request-Id", 64, 3),
]


def send(server, path, body, key=ALPHA, headers=None):
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})}
    if isinstance(body, dict):
        h.update(body.pop("_headers", {}))
        return httpx.post(server.url + path, json=body, headers=h, timeout=60)
    return httpx.post(server.url + path, content=body, headers=h, timeout=60)


def pages_allocated(server) -> int:
    info = server.info()
    assert info["pages_allocated_total"] == server.metric("bulkhead_kv_pages_allocated_total")
    return info["pages_allocated_total"]


def assert_openai_error(r, status, code, param, limit=None, value=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body  # the OpenAI shape, never FastAPI's {"detail": [...]}
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err) <= {"message", "type", "param", "code", "limit", "value"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["code"] == code and err["param"] == param, err
    if limit is None:
        assert "limit" not in err, err
    else:
        assert err["limit"] == limit, err
    if value is None:
        assert "value" not in err, err
    elif value is not ...:  # ... = present, but depends on the tokenizer
        assert err["value"] == value, err
    else:
        assert err["value"] > err["limit"], err
    return err


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_typed_4xx_before_any_page(tiny_server, case):
    _, path, body, status, code, param, limit, value = case
    body = dict(body) if isinstance(body, dict) else body
    before = pages_allocated(tiny_server)
    assert_openai_error(send(tiny_server, path, body), status, code, param, limit, value)
    assert pages_allocated(tiny_server) == before


def test_a_served_request_moves_the_allocation_counter(tiny_server):
    # The control for every case above: the counter does count.
    before = pages_allocated(tiny_server)
    r = send(tiny_server, "/v1/completions", {"prompt": [5] * 40, "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert pages_allocated(tiny_server) > before


def test_a_vanishing_temperature_is_served_greedily_not_failed(tiny_server):
    # 1e-300 used to divide logits into infinities and fail the whole engine step (a 500 for every request in it).
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}
    greedy = send(tiny_server, "/v1/completions", {**body, "temperature": 0})
    tiny = send(tiny_server, "/v1/completions", {**body, "temperature": 1e-300})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def _raw_post(server, head: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + ALPHA.encode() +
              b"\r\nContent-Type: application/json\r\n" + head + b"\r\n")
    return s


def _read_response(s: socket.socket) -> httpx.Response:
    """The server's answer; it closes the connection after a 413 (Connection: close)."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass  # the answer arrived before the reset, or the assertions below say it did not
    head, _, body = data.partition(b"\r\n\r\n")
    return httpx.Response(int(head.split(b" ")[1]), content=body)


def test_a_declared_100_mb_body_is_refused_before_a_byte_is_read(tiny_server):
    before = pages_allocated(tiny_server)
    with _raw_post(tiny_server, b"Content-Length: %d\r\n" % (100 * 2**20)) as s:
        r = _read_response(s)  # the 413 comes back though not one byte of the body was sent
    assert_openai_error(r, 413, "body_too_large", None, MAX_BODY, 100 * 2**20)
    assert pages_allocated(tiny_server) == before


def test_a_chunked_100_mb_body_is_cut_off_at_the_limit(tiny_server):
    before = pages_allocated(tiny_server)
    sent, chunk = 0, b"x" * 2**20
    with _raw_post(tiny_server, b"Transfer-Encoding: chunked\r\n") as s:
        try:
            for _ in range(100):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:
            pass  # the server closed the connection: it stopped reading
        r = _read_response(s)
    # The server read the limit and a little more, never the 100 MB (kernel
    # socket buffers hold a few MB of what the client sent on top).
    assert sent < 50 * 2**20, sent
    err = assert_openai_error(r, 413, "body_too_large", None, MAX_BODY, ...)
    assert err["value"] <= MAX_BODY + 2**20 + 16
    assert pages_allocated(tiny_server) == before
    assert tiny_server.info()["owned_pages"] == 0


def test_a_client_cache_salt_never_reaches_another_tenants_cache(tiny_server):
    prompt = {"prompt": list(range(1000, 1064)), "max_tokens": 1, "cache_salt": "shared-salt"}  # 4 full pages

    def hits():
        return tiny_server.metric("bulkhead_prefix_cache_hit_pages_total")

    assert send(tiny_server, "/v1/completions", dict(prompt), key=ALPHA).status_code == 200
    start = hits()
    assert send(tiny_server, "/v1/completions", dict(prompt), key=BETA).status_code == 200
    assert hits() == start  # same text, same salt, other tenant: no page served from alpha's cache
    assert send(tiny_server, "/v1/completions", dict(prompt), key=ALPHA).status_code == 200
    assert hits() > start  # the control: alpha's own repeat does hit
