"""`make rolling-restart`: restart every worker of a 2 prefill + 2 decode
deployment, one at a time, under steady load, and count what was lost.

Each worker gets SIGTERM (it drains: the router assigns it nothing more,
it finishes what it holds, then exits) and a fresh process takes its name.
Prints requests served and failed, pages left owned or unscrubbed after
the load, and each worker's SIGTERM-to-exit time. Exit 1 if any request
failed or any page was lost.

    python bench/rolling_restart.py [--clients 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.disagg.cluster_tools import wait_workers_idle  # noqa: E402
from tests.faults.fault_cluster import start_fault_cluster  # noqa: E402
from tests.faults.roll import roll  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=3, help="concurrent streaming clients during the roll")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_fault_cluster(Path(tmp))
        try:
            result = roll(cluster, clients=args.clients)
            try:
                workers = wait_workers_idle(cluster, timeout=60)
                lost = sum(w["owned_pages"] + w["dirty_pages"] for w in workers)
            except TimeoutError:
                lost = sum(w["owned_pages"] + w["dirty_pages"] for w in cluster.info()["workers"])
        finally:
            cluster.stop()
    row = {"workers_restarted": len(result.exit_codes), "requests_served": result.served,
           "requests_failed": len(result.failed), "pages_lost": lost, "seconds": result.seconds,
           "drain_seconds": result.drain_seconds, "exit_codes": result.exit_codes}
    print(json.dumps(row, indent=2))
    out = ROOT / "bench" / "results" / "rolling_restart.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(row, indent=2) + "\n")
    return 0 if not result.failed and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
