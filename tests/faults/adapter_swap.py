"""The swap_adapter fault: the adapter's weights change on disk after
prefill computed the prompt under them and before decode loads them, so
decode sees other bytes than the ticket's digest describes (an operator
replacing an adapter directory in place, a disk that differs between
hosts). The shapes stay valid: only the digest check can catch it."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file


def swap_weights(adapter_dir: str) -> None:
    path = Path(adapter_dir) / "adapter_model.safetensors"
    tensors = load_file(str(path))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 0.25
    save_file(tensors, str(path))
