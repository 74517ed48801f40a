import pytest

from bulkhead.engine.admission import Admitted, Limits, Rejection, admit
from bulkhead.engine.request import SamplingParams
from bulkhead.errors import ContextLengthExceeded

LIMITS = Limits(context_length=100, pool_tokens=1000, page_size=16, vocab_size=500)


def params(max_tokens):
    return SamplingParams(max_tokens=max_tokens)


def test_exactly_at_the_context_length_is_admitted():
    d = admit("r", "t", list(range(60)), params(40), LIMITS)
    assert isinstance(d, Admitted)
    assert d.context_length == 100 and d.tenant == "t"


def test_one_over_the_context_length_is_rejected_with_limit_and_value():
    d = admit("r", "t", list(range(60)), params(41), LIMITS)
    assert isinstance(d, Rejection)
    assert isinstance(d.error, ContextLengthExceeded)
    assert (d.error.limit, d.error.value, d.error.param) == (100, 101, "max_tokens")
    assert d.error.to_dict()["error"]["code"] == "context_length_exceeded"


def test_prompt_filling_the_whole_context_is_rejected():
    d = admit("r", "t", list(range(100)), params(1), LIMITS)
    assert isinstance(d, Rejection)
    assert (d.error.limit, d.error.value, d.error.param) == (99, 100, "prompt")


def test_longest_prompt_that_leaves_one_token_is_admitted():
    assert isinstance(admit("r", "t", list(range(99)), params(1), LIMITS), Admitted)


def test_the_pool_limits_admission_when_smaller_than_the_context():
    small_pool = Limits(context_length=100, pool_tokens=64, page_size=16, vocab_size=500)
    assert small_pool.effective_context == 64
    assert isinstance(admit("r", "t", list(range(60)), params(4), small_pool), Admitted)
    d = admit("r", "t", list(range(60)), params(5), small_pool)
    assert isinstance(d, Rejection) and d.error.limit == 64


def test_empty_prompt_is_rejected():
    d = admit("r", "t", [], params(1), LIMITS)
    assert isinstance(d, Rejection) and d.error.code == "empty_prompt"


@pytest.mark.parametrize("bad", [-1, 500, 10**9])
def test_token_ids_outside_the_vocabulary_are_rejected(bad):
    d = admit("r", "t", [1, bad], params(1), LIMITS)
    assert isinstance(d, Rejection) and d.error.code == "invalid_token_id" and d.error.value == bad


def test_rejection_is_not_an_admission():
    d = admit("r", "t", list(range(200)), params(1), LIMITS)
    assert not isinstance(d, Admitted)
