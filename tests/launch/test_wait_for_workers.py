"""The local launcher's wait for its workers to register."""

import logging
import subprocess
import sys
from types import SimpleNamespace

from bulkhead.launch.disaggregated import wait_for_workers


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_slow_start_is_reported_while_it_waits_and_gives_up_at_the_timeout(caplog):
    worker, backend = sleeper(), SimpleNamespace(workers={})
    try:
        with caplog.at_level(logging.INFO, logger="bulkhead"):
            assert not wait_for_workers(backend, [worker], timeout=0.6, progress_every=0.2)
    finally:
        worker.kill()
    progress = [r.getMessage() for r in caplog.records if "registered after" in r.getMessage()]
    assert progress and progress[0].startswith("0 of 1 workers registered"), caplog.text
    assert "did not register within 1s" in caplog.text


def test_the_wait_ends_as_soon_as_every_worker_registered():
    worker = sleeper()
    try:
        assert wait_for_workers(SimpleNamespace(workers={"w": 1}), [worker], timeout=5)
    finally:
        worker.kill()
