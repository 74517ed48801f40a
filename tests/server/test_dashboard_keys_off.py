"""With keys off (loopback only) /dashboard/data is open, like /server_info;
the page never asks for a key then. A stub backend: no engine, milliseconds."""

from fastapi.testclient import TestClient

from bulkhead.engine.admission import Limits
from bulkhead.server.app import ServerState, create_app
from bulkhead.serving.backend import Backend


class StubBackend(Backend):
    model_id = "stub"

    def __init__(self):
        self.tokenizer = None

    @property
    def limits(self):
        return Limits(context_length=64, pool_tokens=64, page_size=16, vocab_size=10)

    def generate(self, tickets):
        raise NotImplementedError

    def info(self):
        return {"role": "colocated", "model": "stub", "guards": "on", "num_pages": 4, "free_pages": 3,
                "owned_pages": 1, "owned_pages_by_tenant": {"default": 1}}

    def collector(self):
        class Empty:
            def collect(self):
                return iter(())
        return Empty()

    def tenant_stats(self):
        return {"default": {"waiting": 0, "running": 1}}


def test_with_keys_off_the_figures_are_open_on_loopback():
    with TestClient(create_app(ServerState(StubBackend(), None))) as http:
        data = http.get("/dashboard/data").json()
        assert data["pools"][0]["free"] == 3 and data["pools"][0]["by_tenant"] == {"default": 1}
        assert data["tenants"]["default"]["running"] == 1
        # The sampler took a point when the server started: a page opened now has something to draw.
        point = data["history"][-1]
        assert point["pools"]["colocated"]["owned"] == 1 and data["history_period_s"] > 0
        newer = http.get("/dashboard/data", params={"since": point["t"]}).json()["history"]
        assert all(p["t"] > point["t"] for p in newer)  # only what the page has not drawn
        assert http.get("/dashboard").status_code == 200
