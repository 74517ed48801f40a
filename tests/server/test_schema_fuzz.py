"""The server's own OpenAPI schema, fuzzed with schemathesis against a live
server over a tiny random model: valid and invalid bodies, path parameters
and headers for every operation. No case may get a 5xx, every error must come
in the OpenAI error shape, and the server must still serve afterwards.

BULKHEAD_FUZZ_EXAMPLES raises the examples per operation and mode (default 25)."""

import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.server.tiny_server import ALPHA, start_tiny_server, stop_checked

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.generation.modes import GenerationMode  # noqa: E402

EXAMPLES = int(os.environ.get("BULKHEAD_FUZZ_EXAMPLES", "25"))
# Short enough that a valid case (up to n=16 choices to the end of the
# context) decodes in about a second on a loaded CPU.
CONTEXT = 96


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, long_tiny_model_dir):
    proc = start_tiny_server(tmp_path_factory.mktemp("fuzz-server"), long_tiny_model_dir,
                             "--context-length", str(CONTEXT))
    yield proc
    stop_checked(proc)


def openai_error_shape(response) -> str | None:
    """What is wrong with an error response's shape, or None."""
    try:
        body = response.json()
    except ValueError:
        return "not JSON"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or set(body) != {"error"}:
        return f"not {{'error': {{...}}}}: {str(body)[:200]}"
    if not {"message", "type", "param", "code"} <= set(err):
        return f"error lacks message/type/param/code: {err}"
    return None


def test_the_openapi_schema_fuzzed_gets_no_5xx_and_only_openai_errors(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8, [op.label for op in operations]
    statuses: dict[str, dict[int, int]] = {}
    bad: list[str] = []

    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            seen = statuses.setdefault(f"{op.label} {mode.value}", {})

            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                r = case.call(base_url=fuzz_server.url, headers={"Authorization": f"Bearer {ALPHA}"}, timeout=120)
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
                if r.status_code >= 500:
                    bad.append(f"{r.status_code} {op.label}: {case.body!r:.300} -> {r.text[:300]}")
                elif r.status_code >= 400 and (problem := openai_error_shape(r)):
                    bad.append(f"{r.status_code} {op.label}: {problem}")

            try:
                run()
            except Unsatisfiable:
                # Nothing to make invalid (no body, no parameters): /health, /metrics...
                assert mode is GenerationMode.NEGATIVE and not seen, op.label

    cases = sum(sum(s.values()) for s in statuses.values())
    fivexx = sum(n for s in statuses.values() for code, n in s.items() if code >= 500)
    print(f"\nschemathesis: {cases} cases, {fivexx} 5xx")
    for label, seen in sorted(statuses.items()):
        print(f"  {label}: {dict(sorted(seen.items()))}")
    assert not bad, "\n".join(bad[:20])
    assert cases >= len(operations) * 2  # it really ran
    # Alive afterwards: health, and a real completion with every page back.
    assert httpx.get(fuzz_server.url + "/health").json() == {"status": "ok"}
    r = httpx.post(fuzz_server.url + "/v1/completions", headers={"Authorization": f"Bearer {ALPHA}"}, timeout=60,
                   json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    assert fuzz_server.wait_idle()["owned_pages"] == 0
