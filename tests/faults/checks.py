"""What every fault scenario asserts once its fault has fired:

(a) the client got a typed error (status + OpenAI error code) or the
    fault-free answer, never a 200 built on unverified KV;
(b) every worker is back to 0 owned and 0 dirty pages (all scrubbed), still
    in poison scrub mode, and no step read poisoned KV (engine_failures 0);
(c) the deployment, or its survivors and replacements, still serve the
    fault-free answer.
(d), the fault's fired counter, is each scenario's own.
"""

from __future__ import annotations

import json
import socket
import uuid

import openai
import pytest

from tests.disagg.cluster_tools import wait_workers_idle
from tests.faults.fault_cluster import MODEL, WORKERS

PROMPT = "The capital of France is"
LONG_PROMPT = "Tell me about the moon and the stars in the sky. " * 4  # > 2 pages: every fault has a page to bend


def greedy(cluster, prompt: str = PROMPT, max_tokens: int = 6, salt: str | None = None, key="sk-alpha-test") -> str:
    """A greedy answer; a fresh cache_salt keeps the prefill prefix cache out of it."""
    r = cluster.client(key).completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
        extra_body={"ignore_eos": True, "cache_salt": salt or uuid.uuid4().hex})
    return r.choices[0].text


def expect_error(status: int, code: str, call, *args, **kwargs) -> dict:
    """(a) for a failure: call() raises the typed error; returns its body."""
    with pytest.raises(openai.APIStatusError) as e:
        call(*args, **kwargs)
    assert (e.value.status_code, e.value.body.get("code")) == (status, code), e.value.body
    return e.value.body


def assert_recovered(cluster, workers=WORKERS) -> None:
    """(b) and (c)."""
    idle = wait_workers_idle(cluster)
    assert sorted(w["name"] for w in idle) == sorted(workers), "a worker is missing"
    for w in idle:
        assert w["scrub_mode"] == "poison", w["name"]
        assert w["engine_failures"] == 0, f"{w['name']}: a step read poisoned KV"
    assert greedy(cluster) == cluster.reference


# -- a client that leaves: a raw socket, closed at the moment a test chooses --
def open_request(cluster, body: dict, key: str = "sk-alpha-test", path: str = "/v1/completions") -> socket.socket:
    """Send a request and return its open connection without reading anything."""
    data = json.dumps({"model": MODEL, **body}).encode()
    sock = socket.create_connection(("127.0.0.1", cluster.port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def read_some(sock: socket.socket, marker: bytes) -> bytes:
    """Read until `marker` has arrived (e.g. the first streamed token)."""
    seen = b""
    while marker not in seen:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:  # the server process died: what arrived is all there is
            break
        if not chunk:
            break
        seen += chunk
    return seen
