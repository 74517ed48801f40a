"""bench/ttft_timeline.py's events, written by every process of a served deployment.

Loaded by this folder's sitecustomize.py where BULKHEAD_TIMELINE names a
folder: each process appends one JSON line per event to tl-<pid>.jsonl
there, on the host's monotonic clock (the client reads the same clock). The
wrappers time the functions the engine, workers and router look up at call
time, so the deployment runs as served; each costs a few microseconds.
"""

import contextlib
import json
import os
import threading
import time

_out = None
_lock = threading.Lock()


def event(kind: str, rid: str | None = None, **fields) -> None:
    line = json.dumps({"t": time.monotonic(), "pid": os.getpid(), "ev": kind, "rid": rid, **fields})
    with _lock:
        _out.write(line + "\n")
        _out.flush()


def _before(cls, name: str, record) -> None:
    """record(*args) before each call of cls.name."""
    orig = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        record(*args)
        return orig(self, *args, **kwargs)

    setattr(cls, name, wrapped)


def _passes(Engine) -> None:
    orig = Engine._run_plan

    def run_plan(self, plan):
        t0, c0, p0 = time.monotonic(), time.thread_time(), time.process_time()
        orig(self, plan)
        event("pass", role="prefill" if self.prefill_only else "decode", t0=t0, cpu=time.thread_time() - c0,
              pcpu=time.process_time() - p0, prefills={w.request_id: len(w.token_ids) for w in plan.prefills},
              rows=len(plan.decode))

    Engine._run_plan = run_plan


def _turns(CoreLease) -> None:
    orig = CoreLease.turn

    @contextlib.contextmanager
    def turn(self, *args, **kwargs):
        asked = time.monotonic()
        with orig(self, *args, **kwargs) as held:
            event("turn", ask=asked, held=held)
            yield held
        event("turn_end")

    CoreLease.turn = turn


def _router(DisaggBackend, messages) -> None:
    send, first = DisaggBackend.send, set()

    def sending(self, worker, message):
        if isinstance(message, messages.Assign) and worker.startswith("prefill"):
            event("r_assign", message.request_id)
        return send(self, worker, message)

    DisaggBackend.send = sending
    on_output = DisaggBackend._handlers[messages.Output]

    def output(self, sender, worker, message):
        if message.request_id not in first:
            first.add(message.request_id)
            event("r_first", message.request_id)
        on_output(self, sender, worker, message)

    DisaggBackend._handlers[messages.Output] = output


def install(folder: str) -> None:
    global _out
    _out = open(os.path.join(folder, f"tl-{os.getpid()}.jsonl"), "a")
    from bulkhead.disagg import messages
    from bulkhead.disagg.decode_worker import DecodeWorker
    from bulkhead.disagg.prefill_worker import PrefillWorker
    from bulkhead.disagg.router import DisaggBackend
    from bulkhead.engine.core_lease import CoreLease
    from bulkhead.engine.engine import Engine

    _passes(Engine)
    _turns(CoreLease)
    _router(DisaggBackend, messages)
    _before(PrefillWorker, "_on_assign", lambda m: event("p_assign", m.ticket.request_id))
    _before(PrefillWorker, "_on_pages_granted", lambda g: event("p_granted", g.request_id))
    _before(PrefillWorker, "_on_output", lambda o: event("p_out", o.request_id, reason=o.finish_reason))
    _before(PrefillWorker, "_transfer", lambda job: event("p_xfer0", job.ticket.request_id))
    _before(DecodeWorker, "_on_prefill_ready", lambda m: event("d_ready", m.request_id))
    _before(DecodeWorker, "_granted", lambda rid, _f: event("d_granted", rid))
    _before(DecodeWorker, "_verify_and_commit", lambda d: event("d_done", d.request_id))
    _before(DecodeWorker, "_checked", lambda rid, _j, _d, _f: event("d_checked", rid))
    seen = set()

    def first_output(out):
        if out.request_id not in seen:
            seen.add(out.request_id)
            event("d_first", out.request_id)

    _before(DecodeWorker, "_on_output", first_output)
