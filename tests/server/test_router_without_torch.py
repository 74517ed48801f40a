"""A router holds no model: `bulkhead serve --role router` never loads torch
(about 240 MB resident and 2 s of start-up before its workers are started,
measured by bench/startup_memory.py)."""

from pathlib import Path

import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e


def test_a_router_process_never_maps_torch(tmp_path):
    router = ServerProcess(["--role", "router", "--cluster-key-file", str(tmp_path / "cluster.key")],
                           tmp_path / "router.log").wait_ready(timeout=120)
    try:
        maps = Path(f"/proc/{router.proc.pid}/maps").read_text()
        info = router.info()
    finally:
        router.stop()
    assert "libtorch" not in maps
    assert info["memory"]["rss_bytes"]["router"] > 0 and info["memory"]["kv_pool_bytes"] == {}
