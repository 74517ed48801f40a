"""End to end: the real server, the real model, the official openai client."""

import json
import threading

import httpx
import openai
import pytest

from bulkhead.model import prefill_attention
from tests.server_process import OPERATOR_HEADERS, OPERATOR_KEY

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.e2e


def ask(client, content, **kw):
    kw.setdefault("max_tokens", 40)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def test_chat_answers_the_capital_of_france(client):
    r = ask(client, "What is the capital of France?")
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_chat_equals_the_non_streamed_answer(client):
    full = ask(client, "Name three colors.", max_tokens=24)
    stream = ask(client, "Name three colors.", max_tokens=24, stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens


def test_completion_with_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    assert "Paris" in r.choices[0].text


def test_chat_logprobs(client):
    r = ask(client, "Say hi.", max_tokens=5, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)


def test_stop_string_cuts_the_text_and_reports_stop(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    text = free.choices[0].text
    assert len(text) > 4
    stop = text[3:5]
    cut = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_token_id_prompt_and_n_with_seed(client):
    r = client.completions.create(model=MODEL, prompt=[504, 3458, 282], max_tokens=8, n=3, seed=7,
                                  temperature=1.0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    again = client.completions.create(model=MODEL, prompt=[504, 3458, 282], max_tokens=8, n=3, seed=7,
                                      temperature=1.0, extra_body={"ignore_eos": True})
    assert [c.text for c in r.choices] == [c.text for c in again.choices]


def test_min_tokens_and_ignore_eos_extensions(client):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=20, temperature=0,
                                  extra_body={"ignore_eos": True, "min_tokens": 20})
    assert r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length"


def test_over_length_prompt_gets_a_typed_400_before_any_page(server, client):
    before = server.metric("bulkhead_rejections_total", tenant="alpha", reason="context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hello " * 3000, max_tokens=10)
    err = e.value.body
    assert e.value.status_code == 400
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["limit"] == 2047 and err["value"] >= 3000
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=2048)
    assert e.value.body["limit"] == 2048 and e.value.body["value"] > 2048
    after = server.metric("bulkhead_rejections_total", tenant="alpha", reason="context_length_exceeded")
    assert after == before + 2
    assert ask(client, "What is the capital of France?").choices[0].message.content  # still serving


def test_bad_and_missing_keys_get_401(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        ask(bad, "hi")
    assert e.value.body["code"] == "invalid_api_key"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"prompt": "hi", "max_tokens": 0}, 400, "invalid_value"),
        ({"prompt": "hi", "n": 1000}, 400, "invalid_value"),
        ({"prompt": [1, -1]}, 400, "invalid_token_id"),
        ({"prompt": [1, 10**9]}, 400, "invalid_token_id"),
        ({"prompt": "hi", "model": "gpt-4"}, 404, "model_not_found"),
        ({"prompt": 5}, 400, "invalid_type"),
        ({"prompt": "hi", "max_tokens": "many"}, 400, "invalid_type"),
    ],
)
def test_bad_requests_get_typed_errors(server, body, status, code):
    r = httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": "Bearer sk-alpha-test"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


def test_malformed_json_and_huge_bodies(server):
    h = {"Authorization": "Bearer sk-alpha-test", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "hi"', headers=h)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "\xff\xfe"}', headers=h)
    assert r.status_code == 400
    r = httpx.post(server.url + "/v1/completions", content=b"x" * (17 * 2**20), headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert server.info()["owned_pages"] == 0


def test_two_tenants_concurrently_get_exactly_their_solo_answers(client, beta_client):
    # The isolation oracle (DESIGN.md section 4): decode is batch-invariant, so
    # a request's greedy tokens among others equal its tokens served alone.
    jobs = [(client, "Write a haiku about the sea."), (beta_client, "List four fruits."),
            (client, "Explain gravity in one sentence."), (beta_client, "What is 12 times 12?")]

    def run(c, prompt):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, logprobs=0,
                                 extra_body={"ignore_eos": True})
        return r.choices[0].logprobs.tokens

    solo = [run(c, p) for c, p in jobs]
    together = [None] * len(jobs)

    def worker(i):
        together[i] = run(*jobs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == solo


def test_client_disconnect_mid_stream_returns_pages(server):
    h = {"Authorization": "Bearer sk-alpha-test"}
    before = server.metric("bulkhead_requests_total", endpoint="completions", status="499")
    body = {"prompt": "Tell me a long story.", "max_tokens": 1000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=h, timeout=60) as r:
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                json.loads(line[6:])
                chunks += 1
            if chunks >= 3:
                break  # leaving the block closes the connection mid-stream
    info = server.wait_idle()
    assert info["owned_pages"] == 0 and info["free_pages"] == info["num_pages"]
    assert server.metric("bulkhead_requests_total", endpoint="completions", status="499") == before + 1


def test_server_info_and_models_show_the_live_limits(server, client):
    info = server.info()
    assert info["context_length"] == 2048 and info["max_input_tokens"] == 2047
    assert info["pool_tokens"] >= info["context_length"]
    assert info["scrub_mode"] == "poison" and info["kv_dtype"] == "bfloat16" and info["page_size"] == 16
    # The kernels say what they compute; prompts' attention is bf16 only beside bf16-input prompts.
    assert info["linear_kernel"] in ("q4", "q4-i16in") and info["decode_glue"] in ("c", "torch")
    assert info["prefill_attention"] == ("bf16" if info["linear_kernel"] != "q4" and prefill_attention.load()
                                         else "torch")
    models = client.models.list()
    assert models.data[0].id == MODEL


def test_metrics_carry_tenants_and_counts_not_text(server, client):
    ask(client, "The secret word is pineapple.", max_tokens=4)
    text = httpx.get(server.url + "/metrics", headers=OPERATOR_HEADERS).text
    assert 'tenant="alpha"' in text and "bulkhead_kv_pages" in text
    assert "pineapple" not in text and "pineapple" not in server.log()


def test_preflight_reads_the_live_server_and_finds_it_clean(server, capsys):
    from bulkhead.cli import main

    code = main(["preflight", server.url, "--api-key", OPERATOR_KEY, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report


def test_the_readme_python_example_runs_as_written(server, capsys):
    """The README's "Talk to it" block, verbatim but for the address and the
    key (this server has keys on): it prints the answer it promises."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.DOTALL).group(1)
    promised = re.search(r"print\(.*\)\s+#\s*(.+)", code).group(1).strip()
    code = code.replace("http://127.0.0.1:8000/v1", server.url + "/v1").replace("unused-on-loopback", "sk-alpha-test")
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == promised
