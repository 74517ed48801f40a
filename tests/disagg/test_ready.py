"""The router's /ready: 503 while no prefill/decode pair can serve (the last
decode worker drained with force, lost, or none registered yet) or while a
worker's lineage log cannot be written; /health stays 200 throughout (it is
liveness). In process: a router with workers registered, no model run."""

import pytest
from fastapi.testclient import TestClient

from bulkhead.server.app import ServerState, create_app
from tests.disagg.test_drain import router  # noqa: F401  (a router with prefill-0, prefill-1, decode-0)


@pytest.fixture
def http(router):
    return TestClient(create_app(ServerState(router, None)))


def _not_ready(http) -> dict:
    response = http.get("/ready")
    assert response.status_code == 503
    return response.json()["error"]


def test_draining_the_last_decode_worker_with_force_makes_ready_503_and_health_stays_200(router, http):
    assert http.get("/ready").json() == {"status": "ready"}
    router.drain("decode-0", force=True)
    error = _not_ready(http)
    assert error["code"] == "not_ready"
    assert "no prefill/decode pair" in error["message"] and "decode-0 draining" in error["message"]
    assert http.get("/health").json() == {"status": "ok"}
    router.resume("decode-0")
    assert http.get("/ready").status_code == 200


def test_one_prefill_drained_of_two_leaves_the_router_ready(router, http):
    router.drain("prefill-0")
    assert http.get("/ready").status_code == 200


def test_a_router_with_no_workers_is_not_ready(router, http):
    for name in list(router.registry.workers):
        router.registry.forget(name)
    error = _not_ready(http)
    assert "no prefill worker takes requests (none registered)" in error["message"]
    assert "no decode worker" in error["message"]


def test_a_worker_whose_lineage_log_cannot_be_written_makes_ready_503(router, http):
    worker = router.registry.workers["prefill-1"]
    worker.info = {**worker.info, "lineage": {"path": "/logs/lineage.prefill-1.jsonl", "records_written": 3,
                                              "records_lost": 0, "write_errors": 1,
                                              "error": "OSError: [Errno 28] No space left on device"}}
    error = _not_ready(http)
    assert error["reasons"] == ["prefill-1: lineage log /logs/lineage.prefill-1.jsonl cannot be written: "
                                "OSError: [Errno 28] No space left on device"]
    assert http.get("/health").status_code == 200
    worker.info = {**worker.info, "lineage": {**worker.info["lineage"], "error": None}}
    assert http.get("/ready").status_code == 200
