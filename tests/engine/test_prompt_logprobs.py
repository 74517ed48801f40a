"""Echo's prompt logprobs (issue 16 item 9): an opt-in per request that makes
prefill compute every prompt row's logits; the default path computes the
sampling row only and sends none."""

import pytest

from tests.engine.test_engine import Collector, assert_clean, prompts, submit


def first(sink, rid):
    return sink.outputs[rid][0]


def test_prompt_logprobs_come_once_with_the_first_token_for_every_prompt_token_but_the_first(make_engine):
    built = make_engine(prefill_chunk=8)  # 40 tokens: five chunks, so the chunk boundaries count
    sink = Collector()
    p = prompts(1, length=40)[0]
    submit(built, sink, "echo", p, max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    submit(built, sink, "plain", p, max_tokens=4, ignore_eos=True, logprobs=2)
    built.engine.run_until_idle()
    got = first(sink, "echo").prompt_logprobs
    assert [lp.token_id for lp in got] == p[1:]
    assert all(lp.logprob <= 0 and len(lp.top) == 2 and lp.top[0][1] >= lp.logprob - 1e-5 for lp in got)
    assert all(not o.prompt_logprobs for o in sink.outputs["echo"][1:])  # once
    assert all(not o.prompt_logprobs for o in sink.outputs["plain"])  # the default path sends none
    assert sink.tokens("echo") == sink.tokens("plain")
    assert_clean(built)


def test_row_p_is_the_logprob_of_prompt_token_p_given_the_tokens_before_it(make_engine):
    # Against the engine's own next-token logprobs: a request whose prompt is
    # p[:k] samples greedily; its first token's top-1 is what row k-1 of the
    # full prompt's logits says, whatever the chunking.
    p = prompts(1, length=30)[0]
    whole, chunked = make_engine(), make_engine(prefill_chunk=7)
    sinks = []
    for built in (whole, chunked):
        sink = Collector()
        submit(built, sink, "echo", p, max_tokens=1, prompt_logprobs=1)
        built.engine.run_until_idle()
        sinks.append(first(sink, "echo").prompt_logprobs)
    for a, b in zip(*sinks):
        assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-3)
    k = 17
    sink = Collector()
    submit(whole, sink, "prefix", p[:k], max_tokens=1, logprobs=1)
    whole.engine.run_until_idle()
    top_token, top_lp = first(sink, "prefix").logprobs[0].top[0]
    assert sinks[0][k - 1].top[0][0] == top_token  # entry k-1 is prompt position k
    assert sinks[0][k - 1].top[0][1] == pytest.approx(top_lp, abs=1e-3)


def test_prompt_logprobs_bypass_the_prefix_cache(make_engine):
    # A cached page has the prompt's KV but not its logits: an echo request
    # computes its whole prompt, and still gets a logprob for every token.
    built = make_engine(prefix_cache=True)
    sink = Collector()
    p = prompts(1, length=50)[0]
    submit(built, sink, "warm", p, max_tokens=2, ignore_eos=True)
    built.engine.run_until_idle()
    hits = built.engine.scheduler.cache.hits
    submit(built, sink, "echo", p, max_tokens=2, ignore_eos=True, prompt_logprobs=0)
    built.engine.run_until_idle()
    assert built.engine.scheduler.cache.hits == hits
    assert len(first(sink, "echo").prompt_logprobs) == len(p) - 1
    built.engine.check_integrity()


def test_a_preempted_echo_request_sends_its_prompt_logprobs_once(make_engine):
    from bulkhead.engine.builder import KV_DTYPE_AUTO
    from bulkhead.kv.layout import KVLayout

    # The tight pool of test_engine's preemption test: requests are preempted
    # after their first token and recomputed; the recompute must not compute
    # or send the prompt's logprobs again.
    layout = KVLayout(2, 2, 16, 16, KV_DTYPE_AUTO)  # the engine's default KV dtype
    built = make_engine(kv_memory_bytes=layout.bytes_per_page * 16, context_length=256)
    sink = Collector()
    ps = prompts(8, length=20)
    for i, p in enumerate(ps):
        submit(built, sink, f"r{i}", p, max_tokens=40, ignore_eos=True, prompt_logprobs=0)
    built.engine.run_until_idle()
    assert built.engine.scheduler.num_preemptions > 0
    for i, p in enumerate(ps):
        sent = [o.prompt_logprobs for o in sink.outputs[f"r{i}"] if o.prompt_logprobs]
        assert len(sent) == 1 and [lp.token_id for lp in sent[0]] == p[1:]
    assert built.engine.stats.failures == 0
    assert not built.engine._prompt_lps  # nothing left behind
    assert_clean(built)
