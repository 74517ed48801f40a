"""Which request fields are served, which are accepted and ignored, and which are refused.

One policy for both endpoints, as OpenAI answers an argument it does not
know: a field bulkhead does not serve is a 400 `unsupported_parameter`
naming the field, never dropped in silence (a client that sends it expects
it to change the answer). The exception is a field that cannot change the
answer here; those are accepted and ignored, each for the reason below.
docs/api.md ("Request fields") lists the three groups.
"""

from __future__ import annotations

from pydantic import BaseModel

from bulkhead.errors import InvalidRequest

# Accepted and ignored: none of these can change the tokens a request gets.
ACCEPTED_IGNORED = {
    # An end-user id for the caller's own abuse tracking; the tenant is the API key.
    "user": "an end-user id for the caller's records",
    # Opt-in to OpenAI's stored completions; bulkhead stores no completion.
    "store": "bulkhead stores no completion",
    # Tags for OpenAI's stored completions, which bulkhead does not keep.
    "metadata": "tags for stored completions, which bulkhead does not keep",
    # A billing/latency tier; every request here is served alike (tenant weights set shares).
    "service_tier": "one tier; shares come from the tenant table",
    # Served with tools in chat (False: one call at most); /v1/completions has no tools.
    "parallel_tool_calls": "served with chat tools; completions have none",
}


def refuse_unknown_fields(body: BaseModel) -> None:
    """Raise a 400 unsupported_parameter for the first field the schema does not declare."""
    for name in body.model_extra or {}:  # pydantic already refused a name that is not valid Unicode
        raise InvalidRequest(f"{name!r} is not a supported parameter (docs/api.md, 'Request fields', lists what is "
                             "served, accepted and ignored, and refused)", param=name, code="unsupported_parameter")
