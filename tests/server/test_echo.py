"""`echo` for /v1/completions (issue 16 item 9), against both deployments:
the text starts with the prompt; with logprobs, the prompt's tokens lead the
logprobs (the first with null, as OpenAI and vLLM answer), computed by
prefill and, disaggregated, carried to decode and back to the router with
the first token; streaming sends the prompt in each choice's first chunk."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import write_keys_file
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e
ROLES = {"colocated": ["--role", "colocated"], "disaggregated": ["--role", "local", "--threads", "1"]}
HEADERS = {"Authorization": "Bearer sk-alpha-test"}
PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture(scope="module", params=sorted(ROLES))
def server(request, tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp(f"echo-{request.param}")
    proc = ServerProcess([*ROLES[request.param], "--model", str(tiny_model_dir), "--model-id", "tiny",
                          "--kv-memory", "64MiB", "--prefill-chunk", "8", "--scrub-mode", "poison",
                          "--api-keys", str(write_keys_file(d)), "--cluster-key-file", str(d / "cluster.key")],
                         d / "server.log").wait_ready(timeout=300)
    yield proc
    proc.stop()


def complete(server, **body) -> httpx.Response:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True, **body}
    return httpx.post(server.url + "/v1/completions", json=body, headers=HEADERS, timeout=120)


def prompt_tokens(server) -> int:
    return complete(server).json()["usage"]["prompt_tokens"]


def test_echo_puts_the_prompt_before_the_completion(server):
    plain = complete(server).json()["choices"][0]["text"]
    echoed = complete(server, echo=True).json()
    assert echoed["choices"][0]["text"] == PROMPT + plain
    assert echoed["choices"][0]["logprobs"] is None
    two = complete(server, echo=True, n=2, prompt=[PROMPT, "Hello there"]).json()["choices"]
    assert [c["text"].startswith(p) for c, p in zip(two, [PROMPT, PROMPT, "Hello there", "Hello there"])] == [True] * 4


def test_echo_with_logprobs_gives_the_prompt_tokens_logprobs_first(server):
    n_prompt = prompt_tokens(server)
    body = complete(server, echo=True, logprobs=2).json()
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == n_prompt + body["usage"]["completion_tokens"]
    assert "".join(lp["tokens"][:n_prompt]) == PROMPT
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(t) >= 1 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"][0] == 0 and lp["text_offset"][n_prompt] == len(PROMPT)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # The completion's own logprobs are those of a request without echo.
    plain = complete(server, logprobs=2).json()["choices"][0]["logprobs"]
    assert lp["tokens"][n_prompt:] == plain["tokens"]
    assert lp["token_logprobs"][n_prompt:] == pytest.approx(plain["token_logprobs"], abs=1e-4)


def test_streamed_echo_sends_the_prompt_in_the_first_chunk(server):
    with httpx.stream("POST", server.url + "/v1/completions", headers=HEADERS, timeout=120, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "echo": True, "logprobs": 1, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    first = chunks[0]["choices"][0]
    assert first["text"].startswith(PROMPT)
    assert first["logprobs"]["token_logprobs"][0] is None
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == complete(server, echo=True).json()["choices"][0]["text"]


def test_chat_has_no_echo(server):
    r = httpx.post(server.url + "/v1/chat/completions", headers=HEADERS, timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_echo_with_max_tokens_0_scores_the_prompt_alone(server):
    # vLLM's, and how evaluation harnesses ask for a prompt's logprobs.
    n_prompt = prompt_tokens(server)
    body = complete(server, echo=True, logprobs=1, max_tokens=0).json()
    choice = body["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == n_prompt and body["usage"]["completion_tokens"] == 0
    with_completion = complete(server, echo=True, logprobs=1).json()["choices"][0]["logprobs"]
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        with_completion["token_logprobs"][1:n_prompt], abs=1e-4)
    r = complete(server, max_tokens=0)  # without echo there is nothing to answer
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
