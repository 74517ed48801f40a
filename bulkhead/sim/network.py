"""The simulated control plane: links with the ZeroMQ links' interface over a
network that delays, drops, duplicates and reorders sealed frames.

Frames are sealed and opened by the real `Signer` (HMAC, sender, incarnation,
sequence number), so a duplicate or an overtaken message meets the same
replay check it would meet in production. Each (sender, receiver) channel is
FIFO like a TCP connection unless the reorder fault lets a message be passed.
A message in flight to a worker that crashes is lost with its connection; the
router's sends to a worker that is down are undeliverable, as ROUTER_MANDATORY
makes them.
"""

from __future__ import annotations

from collections.abc import Callable

from bulkhead.sim.context import SimContext

BASE_LATENCY_S = (0.0005, 0.003)
DELAY_S = (0.05, 1.0)
REORDER_HOLD_S = (0.005, 0.05)


class Network:
    def __init__(self, ctx: SimContext):
        self.ctx = ctx
        self.links: dict[str, object] = {}  # name -> the live link of that name
        self._channel_free_at: dict[tuple[str, str], float] = {}
        self._send_index = 0
        self._delivered_upto: dict[tuple[str, str], int] = {}  # highest send index delivered per channel
        self.in_flight = 0  # non-heartbeat messages still on the wire

    def attach(self, name: str, link) -> None:
        self.links[name] = link

    def detach(self, name: str, link) -> None:
        if self.links.get(name) is link:
            del self.links[name]

    def send(self, src: str, dst: str, frames: list[bytes], message: dict,
             undeliverable: Callable[[str, dict], None] | None = None) -> None:
        ctx, rng, plan = self.ctx, self.ctx.rng, self.ctx.plan
        ctx.sent.append((ctx.now(), src, dst, message))
        target = self.links.get(dst)
        what = _describe(message)
        if target is None:
            ctx.log(f"{src} -> {dst} {what}: undeliverable (down)")
            if undeliverable is not None:
                ctx.after(0.0, guarded, ctx, src, undeliverable, dst, message)  # as the link thread would
            return
        if plan.drop and rng.random() < plan.drop:
            ctx.fire("drop", f"{src} -> {dst} {what}")
            ctx.stats["messages_lost"] += 1
            return
        self._send_index += 1
        index, channel = self._send_index, (src, dst)
        latency = rng.uniform(*BASE_LATENCY_S)
        if plan.delay and rng.random() < plan.delay:
            latency += rng.uniform(*DELAY_S)
            ctx.fire("delay", f"{src} -> {dst} {what} by {latency:.3f}s")
        # FIFO per channel; strictly later, since equal timer times have no order in the loop's heap
        at = max(ctx.now() + latency, self._channel_free_at.get(channel, 0.0) + 1e-6)
        if plan.reorder and rng.random() < plan.reorder:
            at += rng.uniform(*REORDER_HOLD_S)  # held back; later messages may pass it
        else:
            self._channel_free_at[channel] = at
        self._schedule(at, channel, index, target, frames, message)
        if plan.duplicate and rng.random() < plan.duplicate:
            self._schedule(at + rng.uniform(*BASE_LATENCY_S), channel, index, target, frames, message, copy=True)

    def _schedule(self, at, channel, index, target, frames, message, copy=False) -> None:
        counted = message.get("kind") != "heartbeat"
        self.in_flight += counted
        self.ctx.loop.call_at(at, self._deliver, channel, index, target, frames, message, copy, counted)

    def _deliver(self, channel, index, target, frames, message, copy, counted) -> None:
        self.in_flight -= counted
        src, dst = channel
        what = _describe(message)
        if self.links.get(dst) is not target:
            self.ctx.log(f"{src} -> {dst} {what}: lost (receiver restarted or down)")
            return
        if copy:
            self.ctx.fire("duplicate", f"{src} -> {dst} {what}")
        elif index < self._delivered_upto.get(channel, 0):
            self.ctx.fire("reorder", f"{src} -> {dst} {what} overtaken")
        self._delivered_upto[channel] = max(index, self._delivered_upto.get(channel, 0))
        accepted = target.receive(src, frames)
        if not accepted and not copy:
            self.ctx.stats["messages_lost"] += 1  # overtaken, then refused as a replay: as good as dropped
        self.ctx.log(f"{src} -> {dst} {what}" + ("" if accepted else ": dropped by the receiver's replay check"))
        if accepted:
            self.ctx.delivered.append((self.ctx.now(), dst, message))


def _describe(message: dict) -> str:
    kind = message.get("kind")
    rid = message.get("request_id") or (message.get("output") or {}).get("request_id")
    extra = ""
    if kind == "output":
        out = message["output"]
        extra = f" tokens={out['token_ids']}" + (f" finished:{out['finish_reason']}" if out["finished"] else "")
    elif kind == "finalize":
        extra = f" {message.get('outcome')}"
    elif kind == "pages_granted":
        extra = f" pages={message['pages']} gens={message['generations']}"
    return f"{kind}" + (f" {rid}" if rid else "") + extra


class _SimLink:
    """The ZeroMQ links' interface over the simulated network, listening as `name`."""

    def __init__(self, network: Network, signer, name: str):
        self.network, self.signer, self.name = network, signer, name
        self.on_message = self.on_tick = None

    def start(self, on_message, on_tick=None) -> None:
        self.on_message, self.on_tick = on_message, on_tick
        self.network.attach(self.name, self)

    def stop(self) -> None:
        self.network.detach(self.name, self)


class SimWorkerLink(_SimLink):
    def __init__(self, network: Network, after_callback: Callable[[], None], signer, router_address: str):
        super().__init__(network, signer, signer.sender)
        self.after_callback = after_callback  # lets the cluster run the worker's engine after each message

    def send(self, message: dict) -> None:
        self.network.send(self.name, "router", self.signer.seal(message), message)

    def receive(self, src: str, frames: list[bytes]) -> bool:
        message = self.signer.open(frames)
        if message is not None:
            guarded(self.network.ctx, self.name, self.on_message, message)
            self.after_callback()
        return message is not None


class SimRouterLink(_SimLink):
    def __init__(self, network: Network, signer, bind_address: str, on_undeliverable):
        super().__init__(network, signer, "router")
        self.on_undeliverable = on_undeliverable

    def send(self, worker: str, message: dict) -> None:
        self.network.send("router", worker, self.signer.seal(message), message, self.on_undeliverable)

    def receive(self, src: str, frames: list[bytes]) -> bool:
        message = self.signer.open(frames)
        if message is None:
            return False
        if message.get("_from") != src:
            self.signer.stats.dropped_bad_mac += 1  # as RouterLink: a valid MAC from another socket
            return False
        guarded(self.network.ctx, "router", self.on_message, src, message)
        return True


def guarded(ctx: SimContext, who: str, fn, *args) -> None:
    """The real links log a failing handler and carry on; here it is also a finding."""
    try:
        fn(*args)
    except Exception as e:
        what = _describe(args[-1]) if args and isinstance(args[-1], dict) else getattr(fn, "__name__", "a tick")
        ctx.violation("runtime_error", f"{who} handling {what}: {e!r}")
