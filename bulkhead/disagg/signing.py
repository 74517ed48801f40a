"""The authenticated control plane: ZeroMQ frames carrying JSON, each with an
HMAC-SHA256 under the cluster key.

Every message names its sender, the sender's incarnation (random per process
start) and a sequence number; a receiver drops anything whose MAC does not
verify, and anything whose (sender, incarnation, seq) is not newer than the
last it accepted: forged and replayed messages are dropped and counted,
never acted on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from bulkhead.lineage.chain import load_key

MAX_AGE_S = 120.0  # a message older than this is a replay whatever its seq


def load_or_create_key(path: Path) -> bytes:
    """The cluster key file (hex, at least 16 bytes), created with mode 0600 if missing."""
    return load_key(path, create=True, what="cluster key")


@dataclass
class ChannelStats:
    sent: int = 0
    accepted: int = 0
    dropped_bad_mac: int = 0
    dropped_replay: int = 0
    dropped_malformed: int = 0


@dataclass
class Signer:
    """Signs outgoing and verifies incoming control messages for one process."""

    key: bytes
    sender: str
    incarnation: str = field(default_factory=lambda: secrets.token_hex(8))
    stats: ChannelStats = field(default_factory=ChannelStats)

    def __post_init__(self) -> None:
        self._seq = 0
        self._last_seen: dict[tuple[str, str], int] = {}

    def mac(self, body: bytes) -> bytes:
        return hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()

    def seal(self, message: dict) -> list[bytes]:
        self._seq += 1
        envelope = {**message, "_from": self.sender, "_inc": self.incarnation, "_seq": self._seq,
                    "_ts": time.time()}
        body = json.dumps(envelope, separators=(",", ":"), sort_keys=True).encode()
        self.stats.sent += 1
        return [body, self.mac(body)]

    def open(self, frames: list[bytes]) -> dict | None:
        """The message, or None when it must be dropped (and is counted)."""
        if len(frames) != 2:
            self.stats.dropped_malformed += 1
            return None
        body, mac = frames
        if not hmac.compare_digest(self.mac(body), mac):
            self.stats.dropped_bad_mac += 1
            return None
        try:
            message = json.loads(body)
            origin = (message["_from"], message["_inc"])
            seq, ts = int(message["_seq"]), float(message["_ts"])
        except (ValueError, KeyError, TypeError):
            self.stats.dropped_malformed += 1
            return None
        if seq <= self._last_seen.get(origin, 0) or abs(time.time() - ts) > MAX_AGE_S:
            self.stats.dropped_replay += 1
            return None
        self._last_seen[origin] = seq
        self.stats.accepted += 1
        return message
