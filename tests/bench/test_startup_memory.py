"""bench/startup_memory.py's pure helpers: reading VmRSS, naming a process
by its command line, the longest silence of a log, the RSS beyond the pools."""

import json

from bench.startup_memory import Start, beyond_pools, longest_gap, report, role_of, vm_rss_bytes

STATUS = "Name:\tpython\nVmPeak:\t 900 kB\nVmRSS:\t  123456 kB\nRssAnon:\t 100 kB\n"


def test_vm_rss_is_read_in_bytes_and_a_zombie_has_none():
    assert vm_rss_bytes(STATUS) == 123456 * 1024
    assert vm_rss_bytes("Name:\tpython\nState:\tZ (zombie)\n") == 0
    assert vm_rss_bytes("VmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n", "VmHWM") == 2048 * 1024  # the peak


def test_a_worker_is_named_by_its_config_and_anything_else_is_the_router():
    config = json.dumps({"role": "decode", "name": "decode-1", "router": "tcp://127.0.0.1:9"})
    assert role_of(["python", "-m", "bulkhead.cli", "serve", "--role", "decode", "--worker-config", config]) \
        == "decode-1"
    assert role_of(["python", "-m", "bulkhead.cli", "serve", "--role", "prefill"]) == "prefill"
    assert role_of(["python", "-m", "bulkhead.cli", "serve", "--port", "8000"]) == "router"
    assert role_of(["python", "-m", "bulkhead.cli", "serve", "--role", "local"]) == "router"


def test_the_longest_gap_counts_the_start_and_the_end_and_names_the_line_that_ended_it():
    stamps = [(1.0, "a"), (1.5, "b"), (9.0, "c"), (10.0, "d")]
    assert longest_gap(stamps, 0.0, 11.0) == (7.5, "c")
    assert longest_gap(stamps, 0.0, 30.0) == (20.0, "(ready)")  # silent to the end
    assert longest_gap([(5.0, "first")], 0.0, 6.0) == (5.0, "first")  # silent from the start
    assert longest_gap([], 0.0, 2.0) == (2.0, "(ready)")
    assert longest_gap([(1.0, "a"), (50.0, "after ready")], 0.0, 3.0) == (2.0, "(ready)")


def test_rss_beyond_the_pools_and_the_report_shows_each_process():
    rss = {"router": 100 * 2**20, "prefill-0": 3000 * 2**20, "decode-0": 2500 * 2**20}
    pools = {"prefill-0": 2048 * 2**20, "decode-0": 2048 * 2**20}
    assert beyond_pools(rss, pools) == 1504 * 2**20
    text = report([Start(5.0, 6.5, 2.25, "a line", rss, pools)], "warm")
    assert "| 1 | 5.0 | 6.5 | 2.2 (a line) | 5600 | 4096 | 1504 |" in text
    assert "| router | 100 | 0 | 0 |" in text and "| decode-0 | 2500 | 0 | 2048 |" in text
