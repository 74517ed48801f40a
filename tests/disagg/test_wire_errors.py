"""A worker's typed error reaches the client as itself: the router rebuilds
the class a worker refused with on purpose (AdapterUnavailable, Overloaded)
from its code, on decode's last output and on prefill's failure alike."""

import pytest

from bulkhead.disagg import messages as m
from bulkhead.disagg.messages import error_from_wire
from bulkhead.engine.outputs import RequestOutput
from bulkhead.errors import AdapterUnavailable, EngineFailure, Overloaded


@pytest.mark.parametrize("error", [AdapterUnavailable("adapter 'sql' cannot be served", param="model"),
                                   Overloaded("busy")], ids=lambda e: e.code)
def test_decodes_refusal_crosses_the_link_as_its_own_class(error):
    out = RequestOutput("r1", (), "", (), True, "error", 3, 0, error)
    back = m.decode(m.encode(m.Output(out))).output.error
    assert type(back) is type(error)
    assert back.to_dict() == error.to_dict() and back.status == error.status == 503


def test_prefills_refusal_is_rebuilt_from_its_code():
    failed = m.decode(m.encode(m.PrefillFailed("r1", "adapter 'sql' cannot be served", "adapter_unavailable")))
    error = error_from_wire(failed.reason, failed.code)
    assert isinstance(error, AdapterUnavailable) and (error.status, error.type) == (503, "server_error")


def test_any_other_code_stays_an_engine_failure_with_the_workers_code_and_status():
    error = error_from_wire("kv did not verify", "kv_transfer_failed", 500)
    assert type(error) is EngineFailure and (error.code, error.status) == ("kv_transfer_failed", 500)
    assert error_from_wire("odd", None).code == "engine_failure"
