"""bulkhead.disagg.worker_watch: a local decode worker that dies has its
shm KV pool file removed at once, not at the next start."""

import signal
import subprocess
import sys
import time

from bulkhead.disagg.worker_watch import WorkerWatch


def pool_file(shm_dir, pid: int):
    path = shm_dir / f"bulkhead-kv-{pid}-{'ab' * 8}"  # shm.py's name for a decode's pool
    path.write_bytes(b"tenant KV")
    return path


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def wait_swept(watch: WorkerWatch, timeout: float = 10.0) -> list[str]:
    """watch.swept once it names a file: the watch unlinks a file before it
    records it, so waiting for the file to go and then reading swept races."""
    deadline = time.monotonic() + timeout
    while not watch.swept and time.monotonic() < deadline:
        time.sleep(0.05)
    return watch.swept


def test_a_killed_workers_pool_file_goes_and_a_live_ones_stays(tmp_path):
    dead, alive = sleeper(), sleeper()
    dead_file, alive_file = pool_file(tmp_path, dead.pid), pool_file(tmp_path, alive.pid)
    watch = WorkerWatch([dead, alive], "shm", shm_dir=str(tmp_path)).start()
    try:
        time.sleep(0.6)  # a poll with both alive removes nothing
        assert dead_file.exists() and alive_file.exists()
        dead.send_signal(signal.SIGKILL)
        assert wait_swept(watch) == [str(dead_file)]  # without the watch it stays until the next start's sweep
        assert not dead_file.exists() and alive_file.exists()
    finally:
        watch.stop()
        for p in (dead, alive):
            p.kill()
            p.wait()


def test_other_transfers_have_no_pool_file_to_sweep(tmp_path):
    dead = sleeper()
    stale = pool_file(tmp_path, dead.pid)
    watch = WorkerWatch([dead], "tcp", shm_dir=str(tmp_path)).start()
    try:
        dead.kill()
        dead.wait()
        time.sleep(1.2)  # two polls after the exit
        assert stale.exists() and watch.swept == []
    finally:
        watch.stop()
