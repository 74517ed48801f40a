import pytest

from bulkhead.engine.admission import Limits
from bulkhead.errors import InvalidRequest
from bulkhead.server.params import DEFAULT_MAX_TOKENS, completion_prompts, sampling_params, validate_common
from bulkhead.server.schemas import ChatCompletionRequest, CompletionRequest

LIMITS = Limits(context_length=100, pool_tokens=1000, page_size=16, vocab_size=500)


def completion(**kw):
    kw.setdefault("prompt", "hi")
    return CompletionRequest(**kw)


def chat(**kw):
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatCompletionRequest(**kw)


@pytest.mark.parametrize(
    "body,param",
    [
        (completion(max_tokens=0), "max_tokens"),
        (completion(max_tokens=-5), "max_tokens"),
        (completion(n=0), "n"),
        (completion(n=10_000), "n"),
        (completion(temperature=2.5), "temperature"),
        (completion(top_p=0.0), "top_p"),
        (completion(top_k=-2), "top_k"),
        (completion(min_tokens=20, max_tokens=10), "min_tokens"),
        (completion(stop=[""]), "stop"),
        (completion(stop=["x"] * 17), "stop"),
        (completion(stop_token_ids=[500]), "stop_token_ids"),
        (completion(stop_token_ids=[-1]), "stop_token_ids"),
        (completion(logit_bias={"999999": 1.0}), "logit_bias"),
        (completion(logit_bias={"-3": 1.0}), "logit_bias"),
        (completion(logit_bias={"abc": 1.0}), "logit_bias"),
        (completion(logit_bias={"5": 101.0}), "logit_bias"),
        (completion(logprobs=21), "logprobs"),
        (chat(echo=True), "echo"),  # echo is a completions field: chat has no prompt to echo
        (completion(best_of=3), "best_of"),
        (completion(presence_penalty=2.5), "presence_penalty"),
        (chat(frequency_penalty=-3), "frequency_penalty"),
        (completion(repetition_penalty=0), "repetition_penalty"),
        (chat(repetition_penalty=1000), "repetition_penalty"),
        (chat(top_logprobs=3), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=50), "top_logprobs"),
        (chat(max_completion_tokens=0), "max_tokens"),
    ],
)
def test_bad_parameters_get_a_typed_error_naming_the_parameter(body, param):
    with pytest.raises(InvalidRequest) as e:
        validate_common(body, LIMITS)
    assert e.value.param == param
    assert e.value.to_dict()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt", [[1, 2, 500], [[1, 2], [-1]], [], ""])
def test_bad_token_prompts_are_refused(prompt):
    with pytest.raises(InvalidRequest):
        completion_prompts(completion(prompt=prompt), LIMITS, encode=lambda s: [1] * len(s))


def test_prompt_forms():
    enc = lambda s: [7] * len(s)  # noqa: E731
    assert completion_prompts(completion(prompt="abc"), LIMITS, enc) == [[7, 7, 7]]
    assert completion_prompts(completion(prompt=["a", "bb"]), LIMITS, enc) == [[7], [7, 7]]
    assert completion_prompts(completion(prompt=[1, 2]), LIMITS, enc) == [[1, 2]]
    assert completion_prompts(completion(prompt=[[1], [2, 3]]), LIMITS, enc) == [[1], [2, 3]]


def test_defaults_follow_openai():
    p = sampling_params(chat(), prompt_len=30, limits=LIMITS, choice=0)
    assert p.max_tokens == 70  # chat: the rest of a context shorter than the default cap
    assert p.temperature == 1.0 and p.logprobs is None
    assert sampling_params(completion(), 30, LIMITS, 0).max_tokens == 16


LONG_LIMITS = Limits(context_length=8192, pool_tokens=100_000, page_size=16, vocab_size=500)


def test_a_chat_without_max_tokens_is_capped_so_the_readme_example_cannot_run_for_minutes():
    # Issue 16: the README's example (no max_tokens) was allowed 8,155 tokens and looped for minutes.
    assert sampling_params(chat(), 37, LONG_LIMITS, 0).max_tokens == DEFAULT_MAX_TOKENS == 512
    assert sampling_params(completion(max_tokens=None), 37, LONG_LIMITS, 0).max_tokens == 512
    assert sampling_params(chat(max_tokens=4000), 37, LONG_LIMITS, 0).max_tokens == 4000  # asked for: served
    assert sampling_params(chat(min_tokens=600), 37, LONG_LIMITS, 0).max_tokens == 600
    assert sampling_params(chat(), 37, LONG_LIMITS, 0, default_max_tokens=64).max_tokens == 64
    assert sampling_params(chat(), 37, LONG_LIMITS, 0, default_max_tokens=0).max_tokens == 8192 - 37  # vLLM's


def test_serve_default_max_tokens_flag_shows_its_default():
    from bulkhead.cli import build_parser

    assert build_parser().parse_args(["serve"]).default_max_tokens == DEFAULT_MAX_TOKENS
    assert build_parser().parse_args(["serve", "--default-max-tokens", "0"]).default_max_tokens == 0


def test_seed_differs_per_choice():
    body = completion(seed=5, n=2)
    assert sampling_params(body, 3, LIMITS, 0).seed == 5
    assert sampling_params(body, 3, LIMITS, 1).seed == 6


def test_unnamed_sampling_params_come_from_the_models_generation_config():
    defaults = {"temperature": 0.2, "top_p": 0.9, "top_k": 40}
    p = sampling_params(chat(), prompt_len=30, limits=LIMITS, choice=0, defaults=defaults)
    assert (p.temperature, p.top_p, p.top_k) == (0.2, 0.9, 40)
    named = sampling_params(chat(temperature=0.0, top_p=1.0, top_k=0), 30, LIMITS, 0, defaults)
    assert (named.temperature, named.top_p, named.top_k) == (0.0, 1.0, 0)  # the request wins


def test_the_bundled_model_samples_as_its_model_card_says(smollm2_dir):
    from bulkhead.model.config import load_sampling_defaults

    assert load_sampling_defaults(smollm2_dir) == {"temperature": 0.2, "top_p": 0.9}


@pytest.mark.parametrize("body,param", [
    (completion(seed=2**63), "seed"),
    (completion(seed=-(2**63) - 1), "seed"),
    (completion(prompt="a\ud800"), "prompt"),
    (completion(prompt=["ok", "\udfff"]), "prompt"),
    (completion(stop=["\ud800"]), "stop"),
    (completion(cache_salt="\ud800"), "cache_salt"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]), "messages"),
])
def test_values_the_engine_could_not_use_are_refused_at_the_edge(body, param):
    # Each of these once reached the engine and failed a whole step (or the tokenizer) with a 500.
    with pytest.raises(InvalidRequest) as e:
        validate_common(body, LIMITS)
    assert e.value.param == param


def test_penalties_reach_the_sampling_params():
    p = sampling_params(chat(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.3), 3, LIMITS, 0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -1.0, 1.3) and p.penalized
    assert not sampling_params(chat(), 3, LIMITS, 0).penalized


def test_a_vanishing_temperature_samples_greedily():
    assert sampling_params(completion(temperature=1e-300), 3, LIMITS, 0).temperature == 0.0
    assert sampling_params(completion(temperature=0.01), 3, LIMITS, 0).temperature == 0.01


@pytest.mark.parametrize("make", [completion, chat])
@pytest.mark.parametrize("field", ["foo_bar", "reasoning_effort", "guided_grammar"])
def test_a_field_bulkhead_does_not_serve_is_refused_by_name(make, field):
    with pytest.raises(InvalidRequest) as e:
        validate_common(make(**{field: "high"}), LIMITS)
    err = e.value.to_dict()["error"]
    assert err["code"] == "unsupported_parameter" and err["type"] == "invalid_request_error"
    assert err["param"] == field and field in err["message"]


@pytest.mark.parametrize("make", [completion, chat])
def test_openai_fields_that_cannot_change_the_answer_are_accepted_and_ignored(make):
    body = make(user="u-1", store=False, metadata={"k": "v"}, service_tier="auto", parallel_tool_calls=True)
    validate_common(body, LIMITS)
    plain = sampling_params(make(), 3, LIMITS, 0)
    assert sampling_params(body, 3, LIMITS, 0) == plain


def test_echo_asks_prefill_for_prompt_logprobs_only_with_logprobs():
    # Prompt logprobs cost every prompt row's logits: only echo with logprobs pays it.
    def params(**kw):
        return sampling_params(completion(**kw), 2, LIMITS, 0, {}, DEFAULT_MAX_TOKENS)

    assert params(echo=True, logprobs=3).prompt_logprobs == 3
    assert params(echo=True, logprobs=0).prompt_logprobs == 0
    assert params(echo=True).prompt_logprobs is None
    assert params(logprobs=3).prompt_logprobs is None
    validate_common(completion(echo=True, logprobs=2, n=2), LIMITS)  # served, n > 1 included
    validate_common(completion(echo=True, max_tokens=0), LIMITS)  # the prompt alone
    assert params(echo=True, max_tokens=0).max_tokens == 1  # prefill samples once; the token is dropped
    with pytest.raises(InvalidRequest) as e:
        validate_common(completion(max_tokens=0), LIMITS)
    assert e.value.param == "max_tokens"
