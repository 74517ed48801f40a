"""/health is liveness, /ready readiness (bulkhead/server/probes.py): a stub
backend, no engine, milliseconds. The deployments' own reasons are tested
beside them (tests/lineage/test_serve_lineage.py, tests/disagg/test_ready.py)."""

from fastapi.testclient import TestClient

from bulkhead.server.app import ServerState, create_app
from tests.server.test_dashboard_keys_off import StubBackend


class NotServing(StubBackend):
    def __init__(self, reasons):
        super().__init__()
        self.reasons = reasons

    def not_ready(self):
        return self.reasons


def test_ready_is_503_once_the_server_is_told_to_stop():
    stopping = []
    client = TestClient(create_app(ServerState(StubBackend(), None, stopping=lambda: bool(stopping))))
    assert client.get("/ready").json() == {"status": "ready"}
    stopping.append(True)  # SIGTERM: uvicorn's should_exit, while in-flight requests finish
    response = client.get("/ready")
    assert response.status_code == 503 and "shutting down" in response.json()["error"]["message"]
    assert client.get("/health").json() == {"status": "ok"}


def test_ready_names_every_reason_in_the_openai_error_shape_and_health_stays_200():
    client = TestClient(create_app(ServerState(NotServing(["no decode worker", "a log is full"]), None)))
    response = client.get("/ready")
    assert response.status_code == 503
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "not_ready", None)
    assert error["reasons"] == ["no decode worker", "a log is full"]
    assert "no decode worker" in error["message"] and "a log is full" in error["message"]
    assert client.get("/health").status_code == 200
