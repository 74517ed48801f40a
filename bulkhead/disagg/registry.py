"""The router's workers: who is registered, who is live, and the pairing gate.

The gate refuses a worker whose model, KV layout, page size, dtype or
vocabulary differ from the live workers' (PAIR_KEYS): KV written by one must
mean the same to the other. `sweep()` declares a worker silent for
`lost_after_s` lost; the router forgets it once it has failed its requests.
`limits()` is the one admission limit: the smallest over live workers.

Every method takes `lock`, which the router shares (reentrant) with its
route table, so "the pair is still live" and "the route is recorded" are one
step: a worker is declared lost either before a route to it exists or after,
when the sweep finds the route.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from bulkhead.engine.admission import Limits
from bulkhead.errors import Overloaded

LOST_AFTER_S = 3.0
# What must be equal across a pair for KV written by one to mean the same to the other.
PAIR_KEYS = ("model", "kv_layout", "page_size", "kv_dtype", "vocab_size")
ROLES = ("prefill", "decode")


@dataclass
class Worker:
    name: str
    role: str
    info: dict  # its /server_info body, refreshed by every heartbeat
    transfer: dict | None
    last_seen: float
    counters: dict = field(default_factory=dict)
    control: dict = field(default_factory=dict)
    lost: bool = False
    # Drained by an operator or leaving (SIGTERM): never picked for a new
    # request; cleared by a resume or by registering again (the gate applies).
    draining: bool = False
    incarnation: str = ""
    heartbeats: int = 0  # received; lets a reader wait for counters newer than a moment it knows


class WorkerRegistry:
    def __init__(self, model_id: str, clock: Callable[[], float], lost_after_s: float = LOST_AFTER_S):
        self.model_id = model_id
        self.clock = clock  # heartbeat ages
        self.lost_after_s = lost_after_s
        self.lock = threading.RLock()
        self.workers: dict[str, Worker] = {}  # registered, lost ones included until forget()
        self.refused: dict[str, str] = {}  # worker -> why the pairing gate refused it

    # -- joining ----------------------------------------------------------------
    def gate(self, info: dict) -> str | None:
        """Why a worker with this info may not join the live ones, or None."""
        if info.get("role") not in ROLES:
            return f"role {info.get('role')!r} is not a worker role"
        if info.get("model") != self.model_id:
            return f"model {info.get('model')!r} differs from the router's {self.model_id!r}"
        for other in self.live():
            for key in PAIR_KEYS:
                if other.info.get(key) != info.get(key):
                    return f"{key} {info.get(key)!r} differs from worker {other.info['name']}'s {other.info.get(key)!r}"
        return None

    def register(self, name: str, info: dict, transfer: dict | None, incarnation: str) -> tuple[str | None, bool]:
        """Admit a worker through the gate. Returns (why it was refused, or
        None; whether it replaced another incarnation of itself that may
        have held requests: the new one has no state for them. One that had
        drained held none)."""
        with self.lock:
            reason = self.gate(info)
            if reason:
                self.refused[name] = reason
                return reason, False
            previous = self.workers.get(name)
            self.workers[name] = Worker(name, info["role"], info, transfer, self.clock(), incarnation=incarnation)
            self.refused.pop(name, None)
        replaced = previous is not None and previous.incarnation != incarnation
        return None, replaced and state_of(previous) != "drained"

    # -- staying ------------------------------------------------------------------
    def heard_from(self, name: str) -> Worker | None:
        """A registered worker spoke: it is alive now. None if it is unknown."""
        with self.lock:
            worker = self.workers.get(name)
        if worker is not None:
            worker.last_seen = self.clock()
        return worker

    @staticmethod
    def heartbeat(worker: Worker, info: dict, counters: dict, control: dict) -> None:
        worker.info, worker.counters, worker.control = info, counters, control
        worker.heartbeats += 1

    def sweep(self) -> list[tuple[Worker, float]]:
        """Declare lost every live worker silent for lost_after_s; returns
        them, each with how long it was silent. They stay listed (lost)
        until forget(), so no new route is made to them while the router
        fails their old ones."""
        now = self.clock()
        with self.lock:
            newly_lost = [w for w in self.workers.values() if not w.lost and now - w.last_seen > self.lost_after_s]
            for w in newly_lost:
                w.lost = True
        return [(w, now - w.last_seen) for w in newly_lost]

    def forget(self, name: str) -> None:
        with self.lock:
            self.workers.pop(name, None)  # it may come back and register again

    # -- reading ------------------------------------------------------------------
    def all(self) -> list[Worker]:
        with self.lock:
            return list(self.workers.values())

    def live(self) -> list[Worker]:
        with self.lock:
            return [w for w in self.workers.values() if not w.lost]

    def is_assignable(self, name: str) -> bool:
        with self.lock:
            worker = self.workers.get(name)
            return worker is not None and not worker.lost and not worker.draining

    def describe_one(self, name: str) -> dict:
        with self.lock:
            w = self.workers[name]
            return {"name": w.name, "role": w.role, "state": state_of(w)}

    def limits(self) -> Limits:
        """One admission decision against the smallest limit of every live
        worker that could hold the request's KV; Overloaded without a pair."""
        live = [w.info for w in self.live()]
        if not any(i["role"] == "prefill" for i in live) or not any(i["role"] == "decode" for i in live):
            raise Overloaded("no prefill/decode pair is registered yet")
        return Limits(
            context_length=min(i["context_length"] for i in live),
            pool_tokens=min(i["pool_tokens"] for i in live),
            page_size=live[0]["page_size"],
            vocab_size=live[0]["vocab_size"],
        )

    def pick_pair(self, load: Callable[[Worker], int]) -> tuple[Worker, Worker]:
        """The least loaded live prefill and decode workers that are not
        draining; Overloaded without a pair."""
        live = self.assignable()
        prefills = [w for w in live if w.role == "prefill"]
        decodes = [w for w in live if w.role == "decode"]
        if not prefills or not decodes:
            raise Overloaded(f"no prefill/decode pair is registered ({len(prefills)} prefill, "
                             f"{len(decodes)} decode workers live)")
        return min(prefills, key=load), min(decodes, key=load)

    def describe(self) -> list[dict]:
        """Each worker's info with its counters, for the router's /server_info."""
        with self.lock:
            return [dict(w.info, counters=w.counters, control=w.control, lost=w.lost, heartbeats=w.heartbeats,
                         state=state_of(w)) for w in self.workers.values()]

    def assignable(self) -> list[Worker]:
        """Live workers a new request may be given: not lost, not draining."""
        with self.lock:
            return [w for w in self.workers.values() if not w.lost and not w.draining]


def state_of(worker: Worker) -> str:
    """live, draining (no new requests; finishing what it holds), drained
    (draining and holding nothing: it may exit), or lost (no heartbeat)."""
    if worker.lost:
        return "lost"
    if worker.draining:
        return "drained" if worker.info.get("drained") else "draining"
    return "live"
