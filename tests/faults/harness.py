"""The fault matrix's injectors, installed at the seams production exposes.

Production code names no fault: it builds its link, transfer source,
transfer executor, scrub, scheduler and admission function through
`bulkhead.seams.Seams`. `python -m tests.faults.serve` (and so every test
cluster started with BULKHEAD_FAULTS_FILE) runs the same server with the
wrappers below in those places. The file holds fault names, one per line,
and is re-read when it changes, so one running deployment goes through many
scenarios. Every fault that fires is counted (heartbeat counters and
/server_info's `harness_counters`, as `fault_<name>`): a fault test asserts
that its fault really fired, so it cannot pass vacuously (sglang #35890).

  fault                  seam              what it does
  ---------------------  ----------------  ------------------------------------------------
  corrupt_page           transfer source   after the write, page 0 is written again with
                                           bytes its digest does not describe
  short_transfer         source + link     writes and claims one page fewer than granted
  stale_generation       source + link     writes and claims generations one behind the grant
  wrong_pages            link (out)        the manifest claims a page decode did not grant
  slow_transfer          transfer source   the write starts 2 s late
  stall_transfer         transfer source   the write waits until the request ended (the router's
                                           finalize, or its restart), then lands
  stall_past_grant       transfer executor the writer starts after the grant's write_within_s
                                           (it must write nothing)
  stall_prefill          link (in) +engine prefill's engine is busy STALL_S before the assigned
                                           request reaches it (the request waits queued)
  stall_verify           link (in) +engine decode's engine is busy STALL_S before the coverage check
  stall_prefill_until_drain,
  stall_verify_until_drain
                         link (in) +engine as stall_prefill, stall_verify, but busy until the
                                           router's Drain reaches this worker: the request held
                                           there is in flight through the drain, however slow
                                           the machine (tests/lora/test_adapters_roll.py)
  crash_after_grant      link (in)         prefill: os._exit on receiving decode's grant
  crash_before_manifest  link (out)        prefill: os._exit when transfer_done would leave
                                           (pages written, nothing said)
  crash_before_commit    link (in)         decode: os._exit on receiving transfer_done
  withhold_drain_ack     link (out)        prefill never acks the request's drain (decode's
                                           lease must fence the pages)
  replay_control         link (wire)       a sealed message is sent twice
  lose_<kind>            link (wire)       <kind> messages are never sent
  reorder_<kind>         link (wire)       a <kind> message is overtaken by the next one
  swap_adapter           link (in)         decode: the request's adapter weights change on disk
                                           before transfer_done is handled (adapter_swap.py)
  no_scrub               scrub             freed pages keep their KV (colocated)
  legacy_admission       admit + scheduler an over-length request is served the way the
                                           incident's engine did (tests/faults/legacy.py)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bulkhead.disagg.transfer import make_source
from bulkhead.disagg.zmq_links import WorkerLink
from bulkhead.engine.admission import Rejection, admit
from bulkhead.engine.scheduler import Scheduler
from bulkhead.kv.pool import scrub_released
from bulkhead.seams import PRODUCTION, Seams
from tests.faults.adapter_swap import swap_weights
from tests.faults.legacy import LegacyTicket, add_stub

ENV = "BULKHEAD_FAULTS_FILE"
# Worker-to-router messages a link fault can lose or reorder.
CONTROL_KINDS = ("prefill_ready", "pages_granted", "transfer_done", "drain_ack")
KNOWN = ("corrupt_page", "wrong_pages", "short_transfer", "stale_generation", "replay_control",
         "withhold_drain_ack", "slow_transfer", "legacy_admission", "no_scrub",
         "stall_prefill", "stall_past_grant", "stall_transfer", "crash_after_grant", "crash_before_manifest",
         "stall_verify", "crash_before_commit", "swap_adapter", "stall_prefill_until_drain",
         "stall_verify_until_drain",
         *(f"{how}_{kind}" for how in ("lose", "reorder") for kind in CONTROL_KINDS))
STALL_S = 2.0  # stall_prefill, stall_verify: long enough for a client to leave meanwhile
SLOW_S = 2.0  # slow_transfer
CRASH_STATUS = 137  # what a kill -9 leaves; os._exit skips every cleanup, as a crash would


def wait_until(condition, timeout_s: float = 60.0) -> None:
    """A stall that lasts until something else happens (a deadline fires)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


class Faults:
    """The armed set, read from the faults file, and what fired."""

    def __init__(self, path: str | None = None):
        path = path if path is not None else os.environ.get(ENV)
        self.path = Path(path) if path else None
        self._mtime = None
        self._armed: frozenset[str] = frozenset()
        self.fired: dict[str, int] = {}

    def armed(self, name: str) -> bool:
        if self.path is None:
            return False
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._armed, self._mtime = frozenset(), None
            return False
        if mtime != self._mtime:
            names = {line.strip() for line in self.path.read_text().splitlines() if line.strip()}
            unknown = names - set(KNOWN)
            if unknown:
                raise ValueError(f"unknown faults in {self.path}: {sorted(unknown)}")
            self._armed, self._mtime = frozenset(names), mtime
        return name in self._armed

    def fire(self, name: str) -> bool:
        """True (and counted) when `name` is armed."""
        if not self.armed(name):
            return False
        self.fired[name] = self.fired.get(name, 0) + 1
        return True

    def crash(self, name: str) -> None:
        """Die on the spot, like kill -9, when `name` is armed. The counter
        would die with the process, so the crash is recorded first in
        `<faults file>.crashed`, one line per crash, for the test to read."""
        if self.fire(name):
            with open(f"{self.path}.crashed", "a") as f:
                f.write(name + "\n")
            os._exit(CRASH_STATUS)

    def counters(self) -> dict[str, int]:
        return {f"fault_{k}": v for k, v in self.fired.items()}


class Injector:
    """One process's faults, and the wrappers that carry them out, sharing
    what one seam learns and another acts on (a finalize seen by the link
    releases a stalled write in the transfer source)."""

    def __init__(self, faults: Faults):
        self.faults = faults
        self.engine = None           # set by wrap_engine: stalls queue a pause on it
        self.finalized: set[str] = set()   # requests the router has finalized (stall_transfer)
        self.reregisters = 0               # times the router said it does not know us (jobs abandoned)
        self.shortened: set[str] = set()   # short_transfer wrote one page fewer: claim one fewer
        self.stale: set[str] = set()       # stale_generation wrote behind: claim behind
        self.withheld: set[str] = set()    # withhold_drain_ack: never ack these
        self.write_within_s = 0.0          # from the last grant (stall_past_grant)
        self.adapter_dirs: dict[str, str] = {}  # decode: request -> its ticket's adapter path (swap_adapter)
        self.drain_heard = False           # the router's Drain arrived, no Resume since (*_until_drain)

    @classmethod
    def from_env(cls) -> "Injector":
        return cls(Faults())

    def seams(self) -> Seams:
        return Seams(
            make_link=lambda signer, address: FaultyLink(self, signer, address),
            make_source=lambda name, **opts: FaultySource(self, make_source(name, **opts)),
            make_transfer_executor=lambda: LateExecutor(self, PRODUCTION.make_transfer_executor()),
            wrap_engine=self._remember_engine,
            scrub=self._scrub,
            make_scheduler=lambda *a, **kw: LegacyScheduler(*a, **kw),
            admit=self._admit,
            worker_command=(sys.executable, "-m", "tests.faults.serve"),
            counters=self.faults.counters,
        )

    def _remember_engine(self, engine):
        self.engine = engine
        return engine

    def stall_engine(self) -> None:
        """The engine thread is busy for STALL_S: whatever is queued after this waits."""
        self.engine.call(lambda: time.sleep(STALL_S))

    def stall_engine_until_drain(self) -> None:
        """The engine thread is busy until the router's Drain arrives (bounded: wait_until's timeout)."""
        self.engine.call(lambda: wait_until(lambda: self.drain_heard))

    def _scrub(self, pool, ledger) -> int:
        dirty = ledger.dirty_pages()
        if dirty and self.faults.fire("no_scrub"):
            ledger.mark_scrubbed(dirty)  # handed out again with the last owner's KV in them
            return len(dirty)
        return scrub_released(pool, ledger)

    def _admit(self, request_id, tenant, prompt_token_ids, params, limits, cache_salt=None):
        decision = admit(request_id, tenant, prompt_token_ids, params, limits, cache_salt=cache_salt)
        if isinstance(decision, Rejection) and self.faults.fire("legacy_admission"):
            return LegacyTicket(request_id, tenant, tuple(prompt_token_ids), params, limits.context_length)
        return decision


class LegacyScheduler(Scheduler):
    """Queues a LegacyTicket the incident's way (tests/faults/legacy.py)."""

    def add(self, ticket):
        if isinstance(ticket, LegacyTicket):
            return add_stub(self, ticket)
        return super().add(ticket)


class FaultyLink(WorkerLink):
    """A worker's link that bends what it sends and what it hears."""

    def __init__(self, injector: Injector, signer, router_address: str):
        super().__init__(signer, router_address)
        self.injector = injector
        self._held: list[bytes] | None = None  # reorder_<kind>: sealed, sent after the next message

    # -- out --------------------------------------------------------------
    def send(self, message: dict) -> None:
        inj, faults = self.injector, self.injector.faults
        kind, rid = message.get("kind"), message.get("request_id")
        if kind == "transfer_done":
            faults.crash("crash_before_manifest")  # the pages are written; nothing is said
            message = self._bend_manifest(message)
        if kind == "drain_ack" and (rid in inj.withheld or faults.fire("withhold_drain_ack")):
            inj.withheld.add(rid)  # this request's ack never leaves, now or after its finalize
            return
        super().send(message)

    def _bend_manifest(self, message: dict) -> dict:
        inj, faults, rid = self.injector, self.injector.faults, message["request_id"]
        if "manifest" not in message:  # the link's own unit tests send bare kinds
            return message
        m = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in message["manifest"].items()}
        if rid in inj.shortened:
            m["pages"], m["generations"], m["digests"] = m["pages"][:-1], m["generations"][:-1], m["digests"][:-1]
        if rid in inj.stale:
            m["generations"] = [g - 1 for g in m["generations"]]
        if faults.fire("wrong_pages"):  # claims a page list decode did not grant
            m["pages"] = m["pages"][:-1] + [m["pages"][-1] + 1]
        return {**message, "manifest": m}

    def transmit(self, sock, message: dict, frames: list[bytes]) -> None:
        kind, faults = message.get("kind"), self.injector.faults
        if faults.fire(f"lose_{kind}"):
            return  # lost on the way: nothing retransmits, a deadline must end the request
        if self._held is None and faults.fire(f"reorder_{kind}"):
            self._held = frames  # overtaken by the next message: the router sees an older seq
            return
        sock.send_multipart(frames)
        if self._held is not None:
            sock.send_multipart(self._held)
            self._held = None
        if kind != "heartbeat" and faults.fire("replay_control"):
            sock.send_multipart(frames)  # a captured message sent again: the router must drop it

    # -- in ---------------------------------------------------------------
    def start(self, on_message, on_tick=None) -> None:
        super().start(lambda message: self._hear(message, on_message), on_tick)

    def _hear(self, message: dict, on_message) -> None:
        inj, faults, kind = self.injector, self.injector.faults, message.get("kind")
        if kind == "finalize":
            inj.finalized.add(message.get("request_id"))
        elif kind in ("drain", "resume"):
            inj.drain_heard = kind == "drain"
        elif kind == "reregister":
            inj.reregisters += 1  # the worker ends every job as a finalize would
        elif kind == "pages_granted":
            faults.crash("crash_after_grant")
            inj.write_within_s = float(message.get("write_within_s", 0.0))
        elif kind == "transfer_done":
            faults.crash("crash_before_commit")
            if faults.fire("stall_verify"):  # the check queues behind a busy engine
                inj.stall_engine()
            if faults.fire("stall_verify_until_drain"):
                inj.stall_engine_until_drain()
            adapter_dir = inj.adapter_dirs.pop(message.get("request_id"), None)
            if adapter_dir is not None and faults.fire("swap_adapter"):
                swap_weights(adapter_dir)
        elif kind == "assign" and self.signer.sender.startswith("decode") and \
                (adapter := (message.get("ticket") or {}).get("adapter")):
            inj.adapter_dirs[message["ticket"]["request_id"]] = adapter["path"]
        if kind == "assign" and self.signer.sender.startswith("prefill") and faults.fire("stall_prefill"):
            inj.stall_engine()  # the request waits in the engine's queue
        if kind == "assign" and self.signer.sender.startswith("prefill") and faults.fire("stall_prefill_until_drain"):
            inj.stall_engine_until_drain()
        on_message(message)


class FaultySource:
    """Prefill's transfer source, with writes that come late or come wrong."""

    def __init__(self, injector: Injector, source):
        self.injector, self.source = injector, source

    def write_pages(self, descriptor, request_id, pool, src_pages, dst_pages, dst_gens) -> None:
        inj, faults = self.injector, self.injector.faults
        if faults.fire("slow_transfer"):
            time.sleep(SLOW_S)
        if faults.fire("stall_transfer"):  # until the request ends: its deadline, the client, a router restart
            seen = inj.reregisters
            wait_until(lambda: request_id in inj.finalized or inj.reregisters > seen)
        if len(dst_pages) > 1 and faults.fire("short_transfer"):
            inj.shortened.add(request_id)
            src_pages, dst_pages, dst_gens = src_pages[:-1], dst_pages[:-1], dst_gens[:-1]
        if faults.fire("stale_generation"):
            inj.stale.add(request_id)
            dst_gens = [g - 1 for g in dst_gens]
        self.source.write_pages(descriptor, request_id, pool, src_pages, dst_pages, dst_gens)
        if faults.fire("corrupt_page"):  # bytes differ from what the digests describe
            saved = pool.data[src_pages[0]].clone()
            pool.data[src_pages[0]] += 1.0
            try:
                self.source.write_pages(descriptor, request_id, pool, src_pages[:1], dst_pages[:1], dst_gens[:1])
            finally:
                pool.data[src_pages[0]] = saved

    def __getattr__(self, name):
        return getattr(self.source, name)


class LateExecutor:
    """Prefill's transfer thread, starting a write after its window closed."""

    def __init__(self, injector: Injector, executor):
        self.injector, self.executor = injector, executor

    def submit(self, fn, *args):
        if self.injector.faults.fire("stall_past_grant"):
            late_by = self.injector.write_within_s + 0.5
            return self.executor.submit(lambda: (time.sleep(late_by), fn(*args)))
        return self.executor.submit(fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        self.executor.shutdown(wait=wait)
