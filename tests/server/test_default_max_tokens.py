"""A chat that names no max_tokens ends in seconds, whatever the model does (issue 16 item 1)."""

from bulkhead.server.params import DEFAULT_MAX_TOKENS
from tests.conftest import openai_client
from tests.server.tiny_server import ALPHA, LONG_CONTEXT


def test_the_readme_example_without_max_tokens_is_capped_even_by_a_model_that_never_stops(tiny_server):
    # ignore_eos stands in for a model caught in a loop; without the cap it would
    # run to the end of the 8192-token context.
    client = openai_client(tiny_server.url, ALPHA)
    r = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == DEFAULT_MAX_TOKENS < LONG_CONTEXT - r.usage.prompt_tokens
