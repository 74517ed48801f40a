"""A prompt chunk's causal attention on bf16 dot products
(bulkhead.model.prefill_attention)."""

import pytest
import torch
import torch.nn.functional as F

from bulkhead.model import prefill_attention

needs_kernel = pytest.mark.skipif(prefill_attention.load() is None,
                                  reason="no AVX-512 BF16 here, or the kernel cannot be built")


def qkv(tq: int, length: int, heads: int = 9, kv_heads: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tq, heads, 64, generator=gen) * 2, torch.randn(length, kv_heads, 64, generator=gen),
            torch.randn(length, kv_heads, 64, generator=gen))


def sdpa(q, k, v, rounded: bool = False):
    """fp32 SDPA of the last q.shape[0] positions, causal (on bf16-rounded q, k, v if asked)."""
    if rounded:
        q, k, v = (t.bfloat16().float() for t in (q, k, v))
    tq, length = q.shape[0], k.shape[0]
    mask = torch.arange(length)[None, :] <= (length - tq + torch.arange(tq))[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1)


def run(q, k, v):
    return prefill_attention.attention(q, k, v, 64 ** -0.5)


@needs_kernel
@pytest.mark.parametrize("tq,length", [(1, 1), (5, 5), (64, 64), (70, 70), (7, 100), (3, 200), (130, 257)])
def test_it_is_causal_attention_on_bf16_operands(tq, length):
    q, k, v = qkv(tq, length)
    out = run(q, k, v)
    # Against SDPA on the same rounded operands: what is left is the
    # probabilities' rounding to bf16 (a relative 2^-9 each).
    torch.testing.assert_close(out, sdpa(q, k, v, rounded=True), rtol=0, atol=1e-2)
    torch.testing.assert_close(out, sdpa(q, k, v), rtol=0, atol=5e-2)


@needs_kernel
def test_no_query_sees_a_later_position():
    q, k, v = qkv(20, 60)
    out = run(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[50:], v2[50:] = 1e3, -1e3  # positions 50.. are what queries 10.. see first
    later = run(q, k2, v2)
    assert torch.equal(out[:10], later[:10])  # queries at positions 40..49
    assert all(not torch.equal(out[i], later[i]) for i in range(10, 20))  # and the others do see them


@needs_kernel
def test_a_querys_numbers_do_not_depend_on_the_rest_of_its_chunk():
    # Chunked prefill: the same position's attention, whatever else is in the chunk or after it.
    q, k, v = qkv(37, 90)
    whole = run(q, k, v)
    for i in (0, 3, 4, 17, 36):
        pos = 90 - 37 + i
        alone = run(q[i : i + 1], k[: pos + 1], v[: pos + 1])
        assert torch.equal(alone[0], whole[i]), i


@needs_kernel
def test_heads_read_their_own_kv_head():
    q, k, v = qkv(8, 8, heads=6, kv_heads=2)
    out = run(q, k, v)
    for h in range(6):
        alone = run(q[:, h : h + 1], k[:, h // 3 : h // 3 + 1], v[:, h // 3 : h // 3 + 1])
        assert torch.equal(alone[:, 0], out[:, h]), h


@needs_kernel
def test_non_finite_values_reach_the_output():
    q, k, v = qkv(4, 4)
    v[0, 0, 0] = float("nan")
    out = run(q, k, v)
    assert torch.isnan(out[:, :3, 0]).all() and torch.isfinite(out[:, 3:]).all()  # kv head 0: heads 0-2


@needs_kernel
def test_a_query_block_reads_no_key_vector_past_its_last_position():
    # Keys past a row block's last query are skipped 16 at a time, not
    # computed and masked: a NaN at position 40 reaches the queries whose
    # 16-key vectors hold it (rows 32.., whose block of 4 reads to 47), not
    # those before (it did: 0 x NaN, through the whole 64-key block).
    q, k, v = qkv(64, 64)
    clean = run(q, k, v)
    v[40] = float("nan")
    out = run(q, k, v)
    assert torch.equal(out[:32], clean[:32])
    assert torch.isnan(out[40:, :, 0]).all()


@needs_kernel
def test_shapes_it_does_not_take_are_refused():
    q, k, v = qkv(4, 4)
    with pytest.raises(ValueError):
        run(q, k, v[:3])
    with pytest.raises(ValueError, match="refused"):
        run(q, k[:3], v[:3])  # fewer positions than queries
    with pytest.raises(ValueError, match="refused"):
        run(torch.randn(4, 2, 32), torch.randn(4, 1, 32), torch.randn(4, 1, 32))  # head_dim 32


def test_auto_takes_it_only_beside_bf16_input_prompts():
    assert prefill_attention.choose("auto", "q4", 64) == "torch"
    assert prefill_attention.choose("auto", "onednn", 64) == "torch"
    assert prefill_attention.choose("torch", "q4-i16in", 64) == "torch"
    expected = "bf16" if prefill_attention.load() is not None else "torch"
    assert prefill_attention.choose("auto", "q4-i16in", 64) == expected
    assert prefill_attention.choose("auto", "q4-i16in", 128) == "torch"
    with pytest.raises(RuntimeError, match="bf16"):
        prefill_attention.choose("bf16", "q4", 128)
    with pytest.raises(ValueError):
        prefill_attention.choose("fast", "q4", 64)


@needs_kernel
def test_views_into_wider_rows_are_read_in_place_and_out_is_written_in_place():
    q, k, v = qkv(9, 20)
    wide = torch.randn(20, 9 + 3 + 3 + 1, 64)  # a qkv-like row: q's heads, k's, v's and one more
    wide[-9:, :9], wide[:, 9:12], wide[:, 12:15] = q, k, v
    out = torch.full((9, 9 * 64), 7.0)
    got = prefill_attention.attention(wide[-9:, :9], wide[:, 9:12], wide[:, 12:15], 64 ** -0.5, out=out)
    assert got is out and torch.equal(out.view(9, 9, 64), run(q, k, v))
    with pytest.raises(ValueError, match="writes float32"):
        prefill_attention.attention(q, k, v, 0.125, out=torch.empty(9, 9 * 64, dtype=torch.bfloat16))


def pool_views(pages: int = 6, page_size: int = 16, kv_heads: int = 3, dtype: str = "bfloat16"):
    from bulkhead.kv.layout import KVLayout
    from bulkhead.kv.pool import KVPool
    pool = KVPool(KVLayout(2, kv_heads, 64, page_size, dtype), pages)
    return pool, pool.layer_views()[1]  # a layer past the first: pages strided past other layers


@needs_kernel
def test_the_kv_write_stores_what_torchs_indexed_write_stores():
    pool, (k_pages, v_pages) = pool_views()
    expected_pool, (ek, ev) = pool_views()
    rows = torch.randn(21, 3 + 3 + 1, 64)  # k's heads, v's, one more: views with a wider row stride
    rows[2, 0, 5], rows[3, 4, 1], rows[4, 1, 2] = float("nan"), float("inf"), 1.0 + 2 ** -9  # a tie rounds to even
    k, v = rows[:, :3], rows[:, 3:6]
    slots = torch.randperm(6 * 16)[:21]
    pages, offsets = slots // 16, slots % 16
    assert prefill_attention.write_kv(k, v, k_pages, v_pages, pages, offsets)
    ek[pages, :, :, offsets] = k.to(torch.bfloat16)
    ev[pages, offsets] = v.to(torch.bfloat16)
    # The same values bit for bit; NaN as a NaN (torch's vectorised rounding
    # writes 0xffff here, the C kernels torch's scalar 0x7fc0).
    torch.testing.assert_close(pool.data, expected_pool.data, rtol=0, atol=0, equal_nan=True)
    assert k_pages[pages[2], 0, 5, offsets[2]].isnan() and v_pages[pages[3], offsets[3], 1, 1].isinf()


@needs_kernel
@pytest.mark.parametrize("page,offset", [(6, 0), (-1, 0), (2, 16), (2, -1)])
def test_a_kv_write_slot_outside_the_pool_is_refused_before_anything_is_written(page, offset):
    pool, (k_pages, v_pages) = pool_views()
    k = v = torch.ones(3, 3, 64)
    with pytest.raises(IndexError, match="outside the pool"):
        prefill_attention.write_kv(k, v, k_pages, v_pages, torch.tensor([0, 1, page]), torch.tensor([0, 0, offset]))
    assert not pool.data.any()  # rows 0 and 1 were in the pool, and were not written either


def test_the_kv_write_leaves_what_it_does_not_take_to_torch():
    _, (k_pages, v_pages) = pool_views(dtype="float32")
    assert not prefill_attention.write_kv(torch.ones(2, 3, 64), torch.ones(2, 3, 64), k_pages, v_pages,
                                          torch.tensor([0, 1]), torch.tensor([0, 0]))
    _, (k_pages, v_pages) = pool_views()
    assert not prefill_attention.write_kv(torch.ones(2, 3, 64, dtype=torch.bfloat16),
                                          torch.ones(2, 3, 64, dtype=torch.bfloat16), k_pages, v_pages,
                                          torch.tensor([0, 1]), torch.tensor([0, 0]))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_pass_writes_its_kv_and_attends_in_the_models_dtype(dtype):
    from bulkhead.model.attention import paged_attention
    from bulkhead.model.batch import PagedBatch, SequenceSlice

    _, (k_pages, v_pages) = pool_views()
    q, k, v = (t.to(dtype) for t in qkv(20, 20))
    slots = torch.arange(16, 36)  # pages 1 and 2
    batch = PagedBatch(token_ids=torch.zeros(20, dtype=torch.long), positions=torch.arange(20), write_slots=slots,
                       pages=torch.tensor([1, 2]), sequences=(SequenceSlice(0, 20, 20, 0, 2),),
                       logit_rows=torch.tensor([19]))
    out = paged_attention(q, k, v, k_pages, v_pages, batch, prefill_bf16=True)
    assert out.shape == (20, 9 * 64) and out.dtype == dtype
    torch.testing.assert_close(out.float(), run(q.float(), k.float(), v.float()).reshape(20, -1).to(dtype).float())
    assert torch.equal(v_pages[1:3].reshape(32, 3, 64)[:20], v.to(torch.bfloat16))


@needs_kernel
def test_the_kv_write_refuses_mismatched_slots_and_leaves_other_layouts_to_torch():
    _, (k_pages, v_pages) = pool_views()
    k = v = torch.ones(3, 3, 64)
    with pytest.raises(ValueError, match="3 rows need 3 pages"):
        prefill_attention.write_kv(k, v, k_pages, v_pages, torch.tensor([0, 1]), torch.tensor([0, 0]))
    # A pool view whose inner layout is not the one the kernel writes: torch's write, nothing here.
    assert not prefill_attention.write_kv(k, v, k_pages.transpose(2, 3), v_pages, torch.tensor([0, 1, 2]),
                                          torch.tensor([0, 0, 0]))
    assert not prefill_attention.write_kv(torch.ones(3, 6, 64)[:, ::2], v, k_pages, v_pages,
                                          torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]))
