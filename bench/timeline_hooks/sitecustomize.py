"""bench/ttft_timeline.py puts this folder first on PYTHONPATH: where
BULKHEAD_TIMELINE names a folder, every Python process of the deployment
(router, prefill and decode workers) writes its events there
(timeline_hooks.py). The served checkout is the working directory; it goes
first on sys.path so that its bulkhead, not the installed one, is hooked."""

import os

if os.environ.get("BULKHEAD_TIMELINE"):
    import sys

    sys.path.insert(0, os.getcwd())
    import timeline_hooks

    timeline_hooks.install(os.environ["BULKHEAD_TIMELINE"])
