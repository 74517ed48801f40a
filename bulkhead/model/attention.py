"""Attention over the paged KV cache, for prefill chunks and decode steps.

Both write the pass's own K/V into the pool first: a sequence's new rows are
part of what it attends to. Neither reads a position at or past a sequence's
written watermark (kv_len), nor a page outside the sequence's page list
(which the runner has checked it owns, in safe mode).

Decode has two paths. The C kernel (bulkhead.model.decode_kernel) reads each
request's pages in place, one (request, kv head) per thread. The torch path
gathers the step's pages and calls SDPA once per request: batch-invariant
too (each call sees one request), but it copies every page and makes 480
calls a step at 16 requests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bulkhead.model import prefill_attention
from bulkhead.model.batch import PagedBatch
from bulkhead.model.decode_kernel import gather_k_position_major, paged_decode_attention


def paged_attention(
    q: torch.Tensor,  # [T, H, hd]
    k: torch.Tensor,  # [T, KVH, hd]
    v: torch.Tensor,  # [T, KVH, hd]
    k_pages: torch.Tensor,  # [num_pages, KVH, hd, page_size] (bulkhead.kv.pool.KVPool)
    v_pages: torch.Tensor,  # [num_pages, page_size, KVH, hd]
    batch: PagedBatch,
    c_kernel: bool = False,
    slots: tuple[torch.Tensor, torch.Tensor] | None = None,
    prefill_bf16: bool = False,
) -> torch.Tensor:  # [T, H * hd]
    """c_kernel: decode steps read the pool in place through the C kernel
    (bulkhead.model.decode_kernel) instead of gathering pages for SDPA.
    slots: (page, offset) of each real row's write, [N] each, if the caller
    computed them once for every layer; else from batch.write_slots.
    prefill_bf16: a prompt chunk's attention through the bf16 C kernel
    (bulkhead.model.prefill_attention) instead of SDPA."""
    num_real = batch.write_slots.shape[0]
    page_size = v_pages.shape[1]
    pages, offsets = slots if slots is not None else (batch.write_slots // page_size, batch.write_slots % page_size)
    # Into each row's (page, offset), [N, KVH, hd], rounded to the pool's dtype
    # (a 2-byte KV cache); the pool's pages are strided, not one flat row list.
    # A prompt's rows beside the bf16 prompt kernel: its C write, the same values.
    wrote = prefill_bf16 and not batch.decode and prefill_attention.write_kv(k[:num_real], v[:num_real], k_pages,
                                                                            v_pages, pages, offsets)
    if not wrote:
        k_pages[pages, :, :, offsets] = k[:num_real].to(k_pages.dtype)
        v_pages[pages, offsets] = v[:num_real].to(v_pages.dtype)
    if c_kernel and batch.decode:
        return _decode_attention(q, k_pages, v_pages, batch)
    return _per_sequence_attention(q, k, v, k_pages, v_pages, batch, prefill_bf16 and not batch.decode)


def _decode_attention(q, k_pages, v_pages, batch: PagedBatch) -> torch.Tensor:
    """One kernel call for every decode row; rows past the real ones
    (padding to a batch-invariant row count) attend to nothing and stay 0."""
    num_seqs = batch.decode_kv_len.shape[0]
    attn = paged_decode_attention(q[:num_seqs].float(), k_pages, v_pages, batch.pages, batch.decode_page_offset,
                                  batch.decode_kv_len, q.shape[2] ** -0.5).to(q.dtype)  # [S, H, hd], fp32 inside
    if num_seqs == q.shape[0]:
        return attn.view(num_seqs, -1)
    out = q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])
    out[:num_seqs] = attn.view(num_seqs, -1)
    return out


def _per_sequence_attention(q, k, v, k_pages, v_pages, batch: PagedBatch, bf16: bool = False) -> torch.Tensor:
    kvh, hd = k.shape[1], k.shape[2]
    gathered = None
    out = q.new_zeros(q.shape[0], q.shape[1] * hd)
    for seq in batch.sequences:
        rows = slice(seq.row_start, seq.row_end)
        q_seq = q[rows].transpose(0, 1).unsqueeze(0)  # [1, H, Tq, hd]
        if seq.fresh:
            k_seq, v_seq = k[rows], v[rows]  # [L, KVH, hd]
            mask, causal = None, seq.num_queries > 1
        else:
            if gathered is None:  # widened from the pool's dtype for SDPA
                gathered = (_gather_k_pages(k_pages, batch.pages, q.shape[1] // kvh).to(q.dtype),
                            _gather_pages(v_pages, batch.pages, kvh, hd).to(q.dtype))
            start = seq.page_offset * v_pages.shape[1]
            # Only positions below the written watermark kv_len are read.
            k_seq = gathered[0][start : start + seq.kv_len]
            v_seq = gathered[1][start : start + seq.kv_len]
            mask, causal = None if bf16 else _chunk_mask(seq.num_queries, seq.kv_len, q.device), False
        if bf16:  # causal by construction: the queries are the last num_queries of kv_len positions
            if out.dtype == torch.float32:  # into the pass's output rows, no copy
                prefill_attention.attention(q[rows], k_seq, v_seq, hd ** -0.5, out=out[rows])
            else:
                out[rows] = prefill_attention.attention(q[rows], k_seq, v_seq, hd ** -0.5).reshape(seq.num_queries, -1)
            continue
        o = F.scaled_dot_product_attention(
            q_seq,
            k_seq.transpose(0, 1).unsqueeze(0),
            v_seq.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            enable_gqa=True,
        )  # [1, H, Tq, hd]
        out[rows] = o[0].transpose(0, 1).reshape(seq.num_queries, -1)
    return out


def _gather_pages(pages: torch.Tensor, which: torch.Tensor, kvh: int, hd: int) -> torch.Tensor:
    """The listed pages' rows, [len(which) * page_size, KVH, hd]. Selecting
    rows of a 2-D view copies each page as one block: 58 vs 123 us for the
    4-D view on a hot pool, 256 vs 305 us per call in a real decode step
    (measured; the values are the same)."""
    return pages.view(pages.shape[0], -1).index_select(0, which).view(-1, kvh, hd)


def _gather_k_pages(k_pages: torch.Tensor, which: torch.Tensor, group: int) -> torch.Tensor:
    """The listed pages' K, position-major like V: [len(which) * page_size, KVH, hd].
    The C gather where it is built: torch's permute-copy of the same bytes is
    ~10x slower (2.5 ms a layer at 4,096 positions, measured)."""
    fast = gather_k_position_major(k_pages, which, group)
    if fast is not None:
        return fast
    n, (kvh, hd, page_size) = which.shape[0], k_pages.shape[1:]
    rows = k_pages.view(k_pages.shape[0], -1).index_select(0, which).view(n, kvh, hd, page_size)
    return rows.permute(0, 3, 1, 2).reshape(n * page_size, kvh, hd)


def _chunk_mask(num_queries: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    """Causal mask for the last num_queries positions of a kv_len sequence."""
    if num_queries == 1:
        return None  # a single query at the end sees every written position
    first = kv_len - num_queries
    q_pos = torch.arange(first, kv_len, device=device).unsqueeze(1)
    k_pos = torch.arange(kv_len, device=device).unsqueeze(0)
    return k_pos <= q_pos  # [Tq, L] True = may attend
