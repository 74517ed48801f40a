"""Checks every backend runs before moving a byte: page lists and geometry."""

from __future__ import annotations

import torch

from bulkhead.disagg.transfer.base import TransferError


def check_page_lists(src_pages, dst_pages, dst_generations, src_num_pages: int, dst_num_pages: int) -> None:
    """Equal lengths, in range, no destination named twice (two writes racing
    for one page would leave it holding whichever landed last)."""
    if not (len(src_pages) == len(dst_pages) == len(dst_generations)):
        raise TransferError(
            f"{len(src_pages)} source pages, {len(dst_pages)} destination pages and "
            f"{len(dst_generations)} generations: they must be equal",
            drained=True,
        )
    bad_src = [p for p in src_pages if not 0 <= p < src_num_pages]
    bad_dst = [p for p in dst_pages if not 0 <= p < dst_num_pages]
    if bad_src or bad_dst:
        raise TransferError(
            f"pages out of range: source {bad_src} (pool has {src_num_pages}), "
            f"destination {bad_dst} (pool has {dst_num_pages})",
            drained=True,
        )
    if len(set(dst_pages)) != len(dst_pages):
        raise TransferError(f"destination pages named twice in {list(dst_pages)}", drained=True)


def check_geometry(src: torch.Tensor, dst_shape, dst_dtype: str) -> None:
    """Every dimension but the page count must match, and so must the dtype."""
    src_shape = tuple(src.shape)
    dst_shape = tuple(dst_shape)
    if len(src_shape) != 6 or src_shape[1:] != dst_shape[1:]:
        raise TransferError(f"source pool {src_shape} and destination pool {dst_shape} differ in page geometry", drained=True)
    if dtype_name(src.dtype) != dst_dtype:
        raise TransferError(f"source pool is {dtype_name(src.dtype)}, destination is {dst_dtype}", drained=True)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TransferError(f"unknown dtype {name!r} in descriptor", drained=True)
    return dtype
