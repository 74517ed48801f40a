"""The LoRA adapters an engine holds in memory, by digest, while requests use them.

The engine acquires a request's weights (its AdapterRef: name, path,
digest) when it enters and releases them when it ends. The directory is
validated again here (the worker trusts the signed ticket's path, not the
files at it) and the bytes must hash to the ticket's digest, else the
request is refused with AdapterUnavailable. Weights no request holds stay
cached, least recently used dropped first once more than `keep` are idle.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from bulkhead.engine.admission import AdapterRef
from bulkhead.errors import AdapterUnavailable
from bulkhead.lora.peft_files import AdapterRefused, BaseShapes, read_adapter, read_weights
from bulkhead.model.config import ModelConfig
from bulkhead.model.lora_weights import LoraWeights

log = logging.getLogger(__name__)


class AdapterStore:
    def __init__(self, config: ModelConfig | None, keep: int = 8,
                 pack: Callable[[LoraWeights], LoraWeights] | None = None):
        """config: the base model's (None: it serves no adapter). pack: the
        model's adapter_packing, applied as loaded so that one copy is held
        (bulkhead.model.lora_layers.pack_only); None keeps them fp32."""
        self.config, self.keep, self.pack = config, keep, pack
        self._weights: OrderedDict[str, LoraWeights] = OrderedDict()  # digest -> weights, idle ones oldest first
        self._users: dict[str, int] = {}  # digest -> requests holding it

    def acquire(self, ref: AdapterRef) -> LoraWeights:
        """The weights for `ref`, loaded if needed; raises AdapterUnavailable."""
        weights = self._weights.get(ref.digest)
        if weights is None:
            weights = self._load(ref)
            self._weights[ref.digest] = weights
        self._weights.move_to_end(ref.digest)
        self._users[ref.digest] = self._users.get(ref.digest, 0) + 1
        self._evict()
        return weights

    def release(self, digest: str) -> None:
        left = self._users.get(digest, 0) - 1
        if left > 0:
            self._users[digest] = left
        else:
            self._users.pop(digest, None)
        self._evict()

    def get(self, digest: str) -> LoraWeights:
        return self._weights[digest]

    @property
    def users(self) -> dict[str, int]:
        """digest -> requests holding it (Engine.check_integrity compares them with the live requests)."""
        return dict(self._users)

    @property
    def held(self) -> dict[str, int]:
        """digest -> bytes of the weights held now: the fp32 deltas, or (pack) their packed bf16 copy only."""
        return {d: w.nbytes + sum(p.nbytes for p in w.packed) for d, w in self._weights.items()}

    def _load(self, ref: AdapterRef) -> LoraWeights:
        try:
            if self.config is None:
                raise AdapterRefused("this engine's model serves no adapter")
            data = read_weights(Path(ref.path))
            files = read_adapter(Path(ref.path), BaseShapes.of(self.config), data=data)
            if files.digest != ref.digest:
                raise AdapterRefused(f"{ref.path}: the weights changed since they were admitted (digest "
                                     f"{files.digest[:12]}, admitted {ref.digest[:12]})")
            weights = LoraWeights.load(files, self.config, data)
            return self.pack(weights) if self.pack is not None else weights
        except (AdapterRefused, OSError) as e:
            log.error("adapter %r refused: %s", ref.name, e)
            # The name is the tenant's own; the path and the reason stay in the operator's log.
            raise AdapterUnavailable(f"adapter {ref.name!r} cannot be served as it was admitted; "
                                     "the operator's log says why", param="model") from None

    def _evict(self) -> None:
        idle = [d for d in self._weights if d not in self._users]
        for digest in idle[: max(0, len(idle) - self.keep)]:
            del self._weights[digest]
