"""The control plane's guards, without sockets: MAC, replay, ticket, coverage."""

import json

import pytest

from bulkhead.disagg.signing import Signer
from bulkhead.protocol.manifest import Allocation, Manifest, coverage_problems, mismatched_pages, write_admissible
from bulkhead.disagg.ticket import TicketError, sign, signed_ticket_from_dict, signed_ticket_to_dict, verify
from bulkhead.protocol.ticket import SignedTicket
from tests.disagg.tickets import make_ticket

KEY = b"k" * 32


def test_a_sealed_message_opens_once():
    a, b = Signer(KEY, "prefill-0"), Signer(KEY, "router")
    frames = a.seal({"kind": "drain_ack", "request_id": "r1"})
    assert b.open(frames)["request_id"] == "r1"
    assert b.open(frames) is None  # the same frames again: a replay
    assert b.stats.dropped_replay == 1 and b.stats.accepted == 1


def test_a_message_under_another_key_is_dropped():
    forger, router = Signer(b"x" * 32, "prefill-0"), Signer(KEY, "router")
    assert router.open(forger.seal({"kind": "drain_ack", "request_id": "r1"})) is None
    assert router.stats.dropped_bad_mac == 1


def test_a_tampered_body_is_dropped():
    a, b = Signer(KEY, "prefill-0"), Signer(KEY, "router")
    body, mac = a.seal({"kind": "transfer_done", "request_id": "r1"})
    forged = json.loads(body)
    forged["request_id"] = "r2"
    assert b.open([json.dumps(forged).encode(), mac]) is None
    assert b.stats.dropped_bad_mac == 1


def test_malformed_frames_are_dropped():
    b = Signer(KEY, "router")
    assert b.open([b"only one frame"]) is None
    assert b.open([b"not json", b.mac(b"not json")]) is None
    assert b.stats.dropped_malformed == 2


def ticket(**kw):
    return make_ticket(**{"max_tokens": 5, **kw})


def test_a_signed_ticket_verifies_and_a_changed_one_does_not():
    t = sign(ticket(), KEY)
    verify(t, KEY, context_length=100)
    with pytest.raises(TicketError, match="signature"):
        verify(signed_ticket_from_dict({**signed_ticket_to_dict(t), "tenant": "beta"}), KEY, context_length=100)
    with pytest.raises(TicketError, match="signature"):
        verify(SignedTicket(ticket(), ""), KEY, context_length=100)  # never signed


def test_a_worker_refuses_a_ticket_over_its_own_limit():
    # The router's decision, re-checked (not re-made): a pair whose limits
    # differ from what the router admitted against fails the request.
    t = sign(ticket(prompt_token_ids=tuple(range(60)), max_tokens=50, context_length=200), KEY)
    with pytest.raises(TicketError, match="holds 100"):
        verify(t, KEY, context_length=100)


ALLOC = Allocation("r1", "alpha", 1, 1, 40, (7, 3, 9), (2, 5, 1))


def manifest(**kw):
    fields = dict(request_id="r1", tenant="alpha", room=1, epoch=1, prefix_len=0, token_count=40, pages=(7, 3, 9),
                  generations=(2, 5, 1), digests=(11, 22, 33))
    fields.update(kw)
    return Manifest(**fields)


def test_a_manifest_that_matches_its_allocation_commits():
    assert coverage_problems(ALLOC, manifest(), (2, 5, 1), (11, 22, 33)) == []


@pytest.mark.parametrize(
    "change,expect",
    [
        ({"request_id": "r2"}, "request_id"),
        ({"tenant": "beta"}, "tenant"),
        ({"room": 2}, "room"),
        ({"epoch": 2}, "epoch"),
        ({"token_count": 1}, "token_count"),  # the incident: a 1-token stub
        ({"pages": (7, 3, 8)}, "pages"),
        ({"pages": (7, 3), "generations": (2, 5), "digests": (11, 22)}, "pages"),
        ({"generations": (2, 5, 0)}, "generations"),
        ({"digests": (11, 22, 34)}, "digest mismatch on pages [9]"),
    ],
)
def test_any_difference_refuses_the_commit(change, expect):
    problems = coverage_problems(ALLOC, manifest(**change), (2, 5, 1), (11, 22, 33))
    assert any(expect in p for p in problems), problems


def test_a_page_that_moved_on_since_the_grant_refuses_the_commit():
    problems = coverage_problems(ALLOC, manifest(), (2, 6, 1), (11, 22, 33))
    assert any("generation" in p for p in problems)


def test_digests_not_yet_landed_are_not_compared_but_wrong_ones_are():
    # The model checker passes None for a page nothing has landed on yet
    # (it waits for it); the runtime always has a digest of its own.
    assert mismatched_pages((7, 3, 9), (11, None, 30), (11, 22, 33)) == [9]


@pytest.mark.parametrize(
    "writer,page_now,awaiting,admitted",
    [
        (("r1", 4), ("r1", 4), True, True),
        (("r1", 4), ("r1", 5), True, False),  # the page was freed and handed out again
        (("r1", 4), ("r2", 4), True, False),  # another request's page
        (("r1", 4), ("r1", 4), False, False),  # a late or duplicated write after commit
    ],
)
def test_a_write_lands_only_on_the_granted_page_while_its_request_awaits_kv(writer, page_now, awaiting, admitted):
    assert write_admissible(writer, page_now, awaiting) is admitted


def test_local_workers_take_every_core_in_turn_or_split_them_as_told():
    import argparse
    import os

    from bulkhead.disagg.launch import worker_threads

    cores = len(os.sched_getaffinity(0))
    args = lambda **kw: argparse.Namespace(**{"threads": None, "prefill": 1, "decode": 1,  # noqa: E731
                                              "core_sharing": "lease", **kw})
    assert worker_threads(args()) == cores
    assert worker_threads(args(core_sharing="split")) == max(1, cores // 2)
    assert worker_threads(args(core_sharing="split", prefill=4 * cores)) == 1
    assert worker_threads(args(threads=3)) == 3
    assert worker_threads(args(threads=3, core_sharing="split")) == 3


def test_local_workers_are_given_one_lease_of_their_own_launch(monkeypatch, tmp_path):
    import argparse

    from bulkhead.disagg import launch
    from bulkhead.disagg.worker_config import WorkerConfig
    from bulkhead.engine.builder import EngineConfig

    started = []
    # A stand-in process: spawn_workers logs each worker's pid.
    monkeypatch.setattr(launch.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or argparse.Namespace(pid=0))
    monkeypatch.setattr(launch.tempfile, "tempdir", str(tmp_path))  # the lease directories land here
    engine = EngineConfig(tmp_path, "m", 1 << 20)
    args = argparse.Namespace(threads=None, prefill=1, decode=1, drain_lease=30.0, drain_deadline=60.0,
                              log_level="info", transfer="shm", lineage_log=None, lineage_key=None,
                              lineage_max_bytes=1 << 20, core_sharing="lease")
    leases = []
    for _ in range(2):  # two launches on one host
        started.clear()
        launch.spawn_workers(args, "tcp://127.0.0.1:1", tmp_path / "key", {"prefill": engine, "decode": engine})
        configs = [WorkerConfig.from_json(cmd[cmd.index("--worker-config") + 1]) for cmd in started]
        assert [c.role for c in configs] == ["prefill", "decode"]
        assert len({c.engine.core_lease for c in configs}) == 1
        leases.append(configs[0].engine.core_lease)
    assert None not in leases and leases[0] != leases[1]
    started.clear()
    launch.spawn_workers(argparse.Namespace(**{**vars(args), "core_sharing": "split"}), "tcp://127.0.0.1:1",
                         tmp_path / "key", {"prefill": engine, "decode": engine})
    assert all(WorkerConfig.from_json(cmd[cmd.index("--worker-config") + 1]).engine.core_lease is None
               for cmd in started)
