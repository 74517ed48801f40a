"""A decode pool filled by one request: later requests routed to that worker
wait for pages (their grant is deferred: not failed, not stubbed) and, once
pages come back, get exactly the answer they get alone."""

import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.disagg.cluster_tools import arm, disarm, total, wait_for
from tests.faults.checks import assert_recovered, greedy, open_request
from tests.faults.fault_cluster import POOL_TOKENS, SMOLLM2_KV

DECODE_PAGES = POOL_TOKENS["decode"] // SMOLLM2_KV.page_size  # 32
FILLER = "word " * 420  # ~421 tokens: 27 pages granted for its KV ...
WAITER = "count " * 150  # ... and ~151 tokens, 10 pages, cannot fit beside it


def test_full_decode_pool_defers_grants_and_answers_stay_exact(cluster):
    assert DECODE_PAGES == 32
    reference = greedy(cluster, WAITER, max_tokens=4)  # alone (fresh cache salt)
    deferred, stalls = total(cluster, "grants_deferred", "decode", fresh=True), total(cluster, "fault_stall_transfer")
    # The filler's grant is held (its transfer stalls until its client
    # leaves), so its decode worker's pool stays full without computing.
    arm(cluster, "stall_transfer")
    filler = open_request(cluster, {"prompt": FILLER, "max_tokens": 4, "temperature": 0,
                                    "cache_salt": uuid.uuid4().hex})
    try:
        wait_for(lambda: total(cluster, "fault_stall_transfer") > stalls, what="the filler's pages granted")
        disarm(cluster)
        # The router balances by load, so of three more at least one lands
        # on the filler's decode worker and must wait there for pages.
        with ThreadPoolExecutor(max_workers=3) as pool:
            waiters = [pool.submit(greedy, cluster, WAITER, 4) for _ in range(3)]
            wait_for(lambda: total(cluster, "grants_deferred", "decode") > deferred, timeout=30,
                     what="a grant deferred on a full pool")  # (d) the pool filled
            filler.close()  # its client leaves: the grant is released once the stalled write drained
            filler = None
            answers = [w.result(timeout=120) for w in waiters]
    finally:
        if filler is not None:
            filler.close()
    assert answers == [reference] * 3  # (a) exact, not stubbed, not mixed
    assert_recovered(cluster)
