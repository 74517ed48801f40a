"""Start-up time and resident memory of the default deployment (issue 34,
items 6 and 7): `bulkhead serve` with the bundled model, as `make serve`
starts it (router + prefill + decode processes), on a free loopback port.

Measured per start, from the moment the command is spawned:
- health_s: the first 200 from /health (the router is up, its workers registered);
- ready_s: the first 200 from /ready where the tree has it, and one
  completion answered (the deployment serves);
- longest_silence_s: the longest stretch with no line in the log (each line
  is stamped as this script reads it, so output without timestamps counts too),
  and the line that ended it;
- RSS of each process (VmRSS of /proc/PID/status: the router and the workers
  it started, told apart by their command line) and, from /server_info's
  `memory` section, each worker's KV pool, so the RSS beyond the pools.

A warm start reuses the cache under ~/.cache/bulkhead (or $BULKHEAD_CACHE):
the imported model, the compiled kernels and the start-up measurements.
`--cold` points BULKHEAD_CACHE at an empty folder: the first start on a machine.

    .venv/bin/python bench/startup_memory.py            # warm starts (3)
    .venv/bin/python bench/startup_memory.py --cold --runs 1
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_memory import descendants  # noqa: E402
from bench.stopping import exit_on_sigterm  # noqa: E402
from tests.server_process import OPERATOR_ENV, OPERATOR_HEADERS, free_port  # noqa: E402

MIB = 2**20
GIB = 2**30


# -- pure helpers (tests/bench/test_startup_memory.py) ---------------------------------


def vm_rss_bytes(status_text: str, field: str = "VmRSS") -> int:
    """VmRSS (or `field`: VmHWM, the process's peak RSS) of a /proc/PID/status
    text, in bytes (0 where it has none: a zombie)."""
    match = re.search(rf"^{field}:\s+(\d+)\s+kB", status_text, re.M)
    return int(match.group(1)) * 1024 if match else 0


def role_of(cmdline: list[str]) -> str:
    """router, prefill or decode from a `bulkhead serve` command line; the
    workers' own name (prefill-0) is in their --worker-config JSON."""
    if "--role" in cmdline:
        i = cmdline.index("--role")
        if i + 1 < len(cmdline) and cmdline[i + 1] in ("prefill", "decode"):
            config = cmdline[cmdline.index("--worker-config") + 1] if "--worker-config" in cmdline else ""
            name = re.search(r'"name":\s*"([^"]+)"', config)
            return name.group(1) if name else cmdline[i + 1]
    return "router"


def longest_gap(stamps: list[tuple[float, str]], start: float, end: float) -> tuple[float, str]:
    """The longest time between start, each stamped line and end, and the
    line that ended it (the `end` marker when no line came)."""
    best, ended_by, last = 0.0, "(ready)", start
    for t, line in sorted(stamps):
        if t > end:
            break
        if t - last > best:
            best, ended_by = t - last, line
        last = t
    if end - last > best:
        best, ended_by = end - last, "(ready)"
    return best, ended_by


def beyond_pools(rss: dict[str, int], pools: dict[str, int]) -> int:
    """The RSS summed over the processes, less every worker's KV pool."""
    return sum(rss.values()) - sum(pools.values())


@dataclass
class Start:
    health_s: float
    ready_s: float
    longest_silence_s: float
    silence_ended_by: str
    rss: dict[str, int] = field(default_factory=dict)  # process name -> bytes
    pools: dict[str, int] = field(default_factory=dict)  # worker name -> KV pool bytes
    server_info_rss: dict[str, int] = field(default_factory=dict)  # what /server_info says
    peak: dict[str, int] = field(default_factory=dict)  # process name -> VmHWM bytes (its peak RSS so far)


def report(starts: list[Start], label: str) -> str:
    """The figures as a markdown table, one row per start, and each process's RSS."""
    lines = [f"### {label}", "", "| start | /health s | ready s | longest silence s (ended by) | RSS total MiB | "
             "KV pools MiB | RSS beyond pools MiB |", "|---|---|---|---|---|---|---|"]
    for i, s in enumerate(starts, 1):
        lines.append(f"| {i} | {s.health_s:.1f} | {s.ready_s:.1f} | {s.longest_silence_s:.1f} "
                     f"({s.silence_ended_by[:60]}) | {sum(s.rss.values()) / MIB:.0f} | "
                     f"{sum(s.pools.values()) / MIB:.0f} | {beyond_pools(s.rss, s.pools) / MIB:.0f} |")
    if starts:
        last = starts[-1]
        lines += ["", "| process | RSS MiB | peak RSS (VmHWM) MiB | KV pool MiB |", "|---|---|---|---|"]
        lines += [f"| {name} | {rss / MIB:.0f} | {last.peak.get(name, 0) / MIB:.0f} | "
                  f"{last.pools.get(name, 0) / MIB:.0f} |" for name, rss in sorted(last.rss.items())]
    return "\n".join(lines)


# -- one start --------------------------------------------------------------------------


def _stamp_lines(stream, stamps: list[tuple[float, str]], echo) -> None:
    """Each line (or tqdm's carriage-return update) with the time it was read."""
    buf = b""
    while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
        buf += chunk
        *done, buf = re.split(rb"[\r\n]", buf)
        now = time.monotonic()
        for raw in done:
            if raw.strip():
                line = raw.decode(errors="replace")
                stamps.append((now, line))
                echo.write(line + "\n")
    echo.flush()


def _rss_by_process(root: int, field: str = "VmRSS") -> dict[str, int]:
    out = {}
    for pid in descendants(root):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            rss = vm_rss_bytes(Path(f"/proc/{pid}/status").read_text(), field)
        except OSError:
            continue
        if "serve" in cmdline:  # not a compiler a worker runs, say
            out[role_of(cmdline)] = rss
    return out


def _poll(url: str, proc: subprocess.Popen, deadline: float, ok) -> float:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if ok(url):
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready in time")


def _answers(url: str) -> bool:
    r = httpx.post(url + "/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4,
                                                 "temperature": 0}, timeout=60)
    return r.status_code == 200


def _ready(url: str) -> bool:
    r = httpx.get(url + "/ready", timeout=1)
    return r.status_code in (200, 404)  # 404: this tree has no /ready yet


def one_start(extra: list[str], env: dict, log_path: Path, timeout: float) -> Start:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "bulkhead.cli", "serve", "--port", str(port), *extra]
    stamps: list[tuple[float, str]] = []
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, **OPERATOR_ENV, **env})
    with open(log_path, "w") as echo:
        reader = threading.Thread(target=_stamp_lines, args=(proc.stdout, stamps, echo), daemon=True)
        reader.start()
        try:
            deadline = started + timeout
            health = _poll(url, proc, deadline, lambda u: httpx.get(u + "/health", timeout=1).status_code == 200)
            _poll(url, proc, deadline, _ready)
            ready = _poll(url, proc, deadline, _answers)
            rss, peak = _rss_by_process(proc.pid), _rss_by_process(proc.pid, "VmHWM")
            info = httpx.get(url + "/server_info", headers=OPERATOR_HEADERS, timeout=5).json()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(timeout=5)
    memory = info.get("memory", {})
    gap, ended_by = longest_gap(stamps, started, ready)
    return Start(health - started, ready - started, gap, ended_by, rss, memory.get("kv_pool_bytes", {}),
                 memory.get("rss_bytes", {}), peak)


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="starts to measure (default 3)")
    p.add_argument("--cold", action="store_true",
                   help="first start: BULKHEAD_CACHE is an empty folder (model import, kernel builds)")
    p.add_argument("--timeout", type=float, default=900, help="seconds a start may take")
    p.add_argument("--logs", type=Path, default=ROOT / "bench" / "results", help="where each start's log goes")
    p.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: flags for bulkhead serve")
    args = p.parse_args()
    extra = [f for f in args.serve_flags if f != "--"]
    args.logs.mkdir(parents=True, exist_ok=True)
    starts = []
    for i in range(args.runs):
        cache = tempfile.mkdtemp(prefix="bulkhead-cold-") if args.cold else None
        log_path = args.logs / f"startup-{'cold' if args.cold else 'warm'}-{i}.log"
        try:
            starts.append(one_start(extra, {"BULKHEAD_CACHE": cache} if cache else {}, log_path, args.timeout))
        finally:
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
        print(f"start {i + 1}: /health {starts[-1].health_s:.1f} s, ready {starts[-1].ready_s:.1f} s", flush=True)
    label = f"{'cold' if args.cold else 'warm'} start of `bulkhead serve {' '.join(extra)}`".replace("  ", " ")
    print(report(starts, label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
