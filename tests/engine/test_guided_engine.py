"""A grammar-guided request through the engine over a tiny random model:
a random model's answer still matches, guided and plain requests share
steps without changing each other, and no matcher outlives its request."""
import json

from bulkhead.model import guidance
from tests.engine.test_engine import Collector, prompts, submit

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 999}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_a_random_model_answers_in_the_schema_beside_plain_requests(make_engine):
    built = make_engine()
    sink = Collector()
    p = prompts(3)
    submit(built, sink, "plain-alone", p[1], max_tokens=10)
    built.engine.run_until_idle()
    grammar = guidance.json_schema(SCHEMA)
    submit(built, sink, "guided", p[0], max_tokens=40, grammar=grammar)
    submit(built, sink, "plain", p[1], max_tokens=10)
    submit(built, sink, "guided-sampled", p[2], max_tokens=40, grammar=grammar, temperature=1.0, seed=4)
    built.engine.run_until_idle()
    for rid in ("guided", "guided-sampled"):
        final = sink.final(rid)
        assert final.finish_reason == "stop", final
        value = json.loads("".join(o.text for o in sink.outputs[rid]))
        assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool)
    assert sink.tokens("plain") == sink.tokens("plain-alone")  # a guided batch-mate changes nothing
    assert len(built.engine.sampler.grammars) == 0
    built.engine.check_integrity()


def test_an_aborted_guided_request_leaves_no_matcher(make_engine):
    built = make_engine()
    sink = Collector()
    submit(built, sink, "g", prompts(1)[0], max_tokens=40, grammar=guidance.regex("[a-z ]{30,}"))
    built.engine.run_once()
    built.engine.run_once()
    assert len(built.engine.sampler.grammars) == 1 and len(sink.tokens("g")) >= 1  # sampled under its grammar
    built.engine.abort("g")
    built.engine.run_until_idle()
    built.engine.check_integrity()
    assert len(built.engine.sampler.grammars) == 0
