"""Grammar-guided sampling (engine/grammar_mask.py): every sampled token is
one the request's grammar allows, greedy with a mask is the argmax of the
masked logits, a row's mask does not depend on its batch-mates, and a
sampler that never saw the request (a decode worker after the handoff)
continues it exactly from the grammar text and the tokens so far."""
import json

import pytest
import torch

from bulkhead.engine.grammar_mask import GrammarMasks
from bulkhead.engine.request import Request, SamplingParams
from bulkhead.engine.sampler import Sampler
from bulkhead.model import guidance
from bulkhead.model.tokenizer import Tokenizer

EOS = 2
V = 49152
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer(smollm2_dir)


def _sampler(tok) -> Sampler:
    return Sampler((EOS,), GrammarMasks(tok.to_json(), V, (EOS,)))


def _request(rid, grammar=None, **params) -> Request:
    params.setdefault("temperature", 0.0)
    return Request(rid, "alpha", [1, 2, 3], SamplingParams(max_tokens=200, grammar=grammar, **params), arrival=0)


def _generate(sampler, req, seed=0, steps=200, mates=0) -> list[int]:
    gen, other = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        logits = torch.cat([torch.randn(1, V, generator=gen), torch.randn(mates, V, generator=other)])
        batch = [req] + [_request(f"mate-{k}") for k in range(mates)]
        token = sampler.sample(batch, logits)[0][0]
        req.output_token_ids.append(token)
        if token == EOS:
            break
    return req.output_token_ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_random_logits_still_give_json_that_matches_the_schema(tok, temperature):
    req = _request("a", guidance.json_schema(SCHEMA), temperature=temperature, seed=5)
    out = _generate(_sampler(tok), req)
    assert out[-1] == EOS
    value = json.loads(tok.decode(out))
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


def test_without_a_grammar_random_logits_give_no_json(tok):
    out = _generate(_sampler(tok), _request("a"), steps=20)
    with pytest.raises(ValueError):
        json.loads(tok.decode(out))


def test_greedy_with_a_mask_is_the_argmax_of_the_masked_logits(tok):
    sampler = _sampler(tok)
    req = _request("a", guidance.choice(["yes", "no"]))
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    token = sampler.sample([req], logits)[0][0]
    allowed = [t for t in range(V) if tok.token_text(t) in ("yes", "no", "y", "n", "ye")]
    assert token == max(allowed, key=lambda t: logits[0, t])


def test_a_guided_row_does_not_depend_on_its_batch_mates(tok):
    grammar = guidance.json_schema(SCHEMA)
    alone = _generate(_sampler(tok), _request("a", grammar))
    crowded = _generate(_sampler(tok), _request("a", grammar), mates=3)
    assert alone == crowded


def test_unguided_batch_mates_are_sampled_as_without_the_grammar(tok):
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(2))
    plain = [_request("b"), _request("c", temperature=1.0, seed=3)]
    guided = _request("a", guidance.regex("[0-9]+"))
    with_guided = _sampler(tok).sample([plain[0], guided, plain[1]], logits)[0]
    without = _sampler(tok).sample(plain, logits[[0, 2]])[0]
    assert [with_guided[0], with_guided[2]] == without


def test_a_new_sampler_continues_from_the_grammar_and_the_tokens_so_far(tok):
    """The decode worker's case: it gets the grammar in the ticket and the
    first token prefill sampled, never the matcher."""
    grammar = guidance.json_schema(SCHEMA)
    whole = _generate(_sampler(tok), _request("a", grammar), seed=7)
    prefill = _sampler(tok)
    req = _request("a", grammar)
    gen = torch.Generator().manual_seed(7)
    req.output_token_ids.append(prefill.sample([req], torch.randn(1, V, generator=gen))[0][0])
    decode = _sampler(tok)  # knows nothing of the request
    while req.output_token_ids[-1] != EOS:
        req.output_token_ids.append(decode.sample([req], torch.randn(1, V, generator=gen))[0][0])
    assert req.output_token_ids == whole


def test_a_complete_grammar_ends_the_answer_even_before_min_tokens(tok):
    """min_tokens bans EOS, the finished grammar allows only EOS: the grammar wins."""
    req = _request("a", guidance.choice(["yes"]), temperature=1.0, seed=1, min_tokens=50)
    out = _generate(_sampler(tok), req, steps=10)
    assert tok.decode(out) == "yes" and out[-1] == EOS


def test_forget_drops_the_matcher(tok):
    sampler = _sampler(tok)
    sampler.sample([_request("a", guidance.regex("a+"))], torch.zeros(1, V))
    assert len(sampler.grammars) == 1
    sampler.forget("a")
    assert len(sampler.grammars) == 0
