"""The C decode-attention kernel (bulkhead.model.decode_kernel) against SDPA,
and the properties the isolation oracle needs of it."""

import pytest
import torch
import torch.nn.functional as F

from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool
from bulkhead.model import decode_kernel
from bulkhead.model.decode_kernel import KernelError, choose, paged_decode_attention

KVH, HD, PS, H = 3, 64, 16, 9
pytestmark = pytest.mark.skipif(decode_kernel.load(HD, H // KVH, PS) is None, reason="no C compiler here")


def make_case(lengths, num_pages=256, seed=0, scrub="zero", kv_dtype="float32"):
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(KVLayout(1, KVH, HD, PS, kv_dtype), num_pages, scrub)
    pool.data.copy_(torch.randn(pool.data.shape, generator=gen))
    order = torch.randperm(num_pages, generator=gen).tolist()
    pages, offsets = [], []
    for n in lengths:
        offsets.append(len(pages))
        pages += order[len(pages) : len(pages) + -(-n // PS)]
    q = torch.randn(len(lengths), H, HD, generator=gen)
    return pool, q, torch.tensor(pages), torch.tensor(offsets), torch.tensor(lengths)


def run(pool, q, pages, offsets, lengths):
    k, v = pool.layer_views()[0]
    return paged_decode_attention(q, k, v, pages, offsets, lengths, HD**-0.5)


def sdpa_reference(pool, q, pages, offsets, lengths):
    k, v = pool.layer_views()[0]
    out = []
    for b, n in enumerate(lengths.tolist()):
        own = pages[offsets[b] : offsets[b] + -(-n // PS)]
        k_b = k[own].permute(0, 3, 1, 2).reshape(-1, KVH, HD)[:n].float()  # position-major, widened
        v_b = v[own].reshape(-1, KVH, HD)[:n].float()
        o = F.scaled_dot_product_attention(q[b : b + 1].unsqueeze(2), k_b.transpose(0, 1).unsqueeze(0),
                                           v_b.transpose(0, 1).unsqueeze(0), enable_gqa=True)
        out.append(o[0, :, 0])
    return torch.stack(out)


LENGTHS = [1, 5, 16, 17, 100, 257, 384]  # one token, partial and whole pages


def test_it_computes_what_sdpa_computes():
    case = make_case(LENGTHS)
    torch.testing.assert_close(run(*case), sdpa_reference(*case), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16"])
def test_a_two_byte_pool_is_read_exactly_widened_to_fp32(kv_dtype):
    # The kernel widens each stored element (exact) and computes in fp32: the
    # same as SDPA over the widened pool, and batch-invariant as in fp32.
    case = make_case(LENGTHS, kv_dtype=kv_dtype)
    assert case[0].data.dtype == getattr(torch, kv_dtype)
    got = run(*case)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, sdpa_reference(*case), rtol=1e-5, atol=1e-5)
    pool, q, pages, offsets, lengths = case
    alone = run(pool, q[3:4], pages, offsets[3:4], lengths[3:4])
    assert torch.equal(alone[0], got[3])


def test_a_two_byte_pool_gathers_k_in_its_own_dtype():
    pool, _, _, _, _ = make_case([32], kv_dtype="bfloat16")
    k, _ = pool.layer_views()[0]
    which = torch.tensor([5, 2])
    got = decode_kernel.gather_k_position_major(k, which, H // KVH)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, k[which].permute(0, 3, 1, 2).reshape(-1, KVH, HD))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_requests_numbers_do_not_depend_on_its_batch_mates(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        pool, q, pages, offsets, lengths = make_case(LENGTHS * 3)  # enough work to use every thread
        together = run(pool, q, pages, offsets, lengths)
        for b in range(len(lengths)):
            alone = run(pool, q[b : b + 1], pages, offsets[b : b + 1], lengths[b : b + 1])
            assert torch.equal(alone[0], together[b]), b
    finally:
        torch.set_num_threads(previous)


@pytest.mark.skipif(not decode_kernel.torch_uses_libgomp(), reason="torch here does not run on libgomp")
def test_it_runs_in_torchs_openmp_team_where_torch_has_one():
    assert decode_kernel.threading(decode_kernel.load(HD, H // KVH, PS)) == "openmp"


def test_the_pthread_pool_computes_the_same_numbers(monkeypatch):
    # The fallback where torch has no libgomp (or -fopenmp does not build).
    case = make_case(LENGTHS * 3)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        default = run(*case)
        monkeypatch.setattr(decode_kernel, "torch_uses_libgomp", lambda: False)
        pthreads = decode_kernel.load.__wrapped__(HD, H // KVH, PS)
        assert decode_kernel.threading(pthreads) == "pthreads"
        monkeypatch.setattr(decode_kernel, "load", lambda *geometry: pthreads)
        assert torch.equal(run(*case), default)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "float16"])
def test_the_vector_loops_compute_the_plain_loops_numbers_bit_for_bit(kv_dtype, monkeypatch):
    # Whole pages run through GCC vector types with more sums in flight
    # (csrc/paged_decode_attention.c); each sum must stay the plain loops'
    # own, term for term, or the speed-up would move every figure in the
    # quality table. -DPLAIN_LOOPS builds the kernel without them.
    case = make_case(LENGTHS * 3, kv_dtype=kv_dtype)  # 4-page groups, leftover whole pages, partial pages
    default = run(*case)
    monkeypatch.setattr(decode_kernel, "FLAGS", (*decode_kernel.FLAGS, "-DPLAIN_LOOPS"))
    plain = decode_kernel.load.__wrapped__(HD, H // KVH, PS, kv_dtype)
    monkeypatch.setattr(decode_kernel, "load", lambda *geometry: plain)
    assert torch.equal(run(*case), default)


def test_slots_past_the_watermark_are_never_read():
    # Poison mode fills unwritten slots with NaN; a request whose last page
    # is partly written must not see them.
    pool, q, pages, offsets, lengths = make_case([5, 20])
    clean = run(pool, q, pages, offsets, lengths)
    k, v = pool.layer_views()[0]
    last_page = pages[offsets[1] + 1]
    k[last_page, :, :, 4:] = float("nan")  # positions 20.. of request 1
    v[last_page, 4:] = float("nan")
    k[pages[0], :, :, 5:] = float("nan")
    v[pages[0], 5:] = float("nan")
    assert torch.equal(run(pool, q, pages, offsets, lengths), clean)


def test_a_poisoned_position_it_does_read_comes_out_as_nan_for_that_request_only():
    pool, q, pages, offsets, lengths = make_case([30, 30])
    k, v = pool.layer_views()[0]
    v[pages[offsets[1]], 3] = float("nan")
    out = run(pool, q, pages, offsets, lengths)
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).all()
    k[pages[0], 0, 0, 2] = float("nan")  # a NaN key poisons its head's scores
    assert torch.isnan(run(pool, q, pages, offsets, lengths)[0, : H // KVH]).all()
    k[pages[0], 0, 0, 2] = float("inf")  # so does an infinite one (corrupted, not poisoned)
    assert not torch.isfinite(run(pool, q, pages, offsets, lengths)[0, : H // KVH]).any()


def test_a_page_outside_the_pool_is_refused_before_anything_is_read():
    pool, q, pages, offsets, lengths = make_case([20, 20])
    bad = pages.clone()
    bad[offsets[1]] = pool.num_pages  # one past the last page
    with pytest.raises(KernelError, match="decode row 1's page list .* outside the pool"):
        run(pool, q, bad, offsets, lengths)
    with pytest.raises(KernelError, match="decode row 1's page list runs past the page table"):
        run(pool, q, pages[:-1], offsets, lengths)  # the table ends before row 1's last page


def test_c_is_refused_where_it_cannot_run_and_auto_falls_back():
    assert choose("auto", "float32", H, KVH, HD, PS) == "c"
    assert choose("torch", "float32", H, KVH, HD, PS) == "torch"
    assert choose("auto", "bfloat16", H, KVH, HD, PS) == "c"  # 2-byte pools too
    assert choose("auto", "float64", H, KVH, HD, PS) == "torch"
    with pytest.raises(RuntimeError, match="KV dtype float64"):
        choose("c", "float64", H, KVH, HD, PS)
    assert choose("auto", "float32", 9, 3, 512, PS) == "torch"  # head_dim over the C file's limit
    with pytest.raises(ValueError, match="decode attention must be one of"):
        choose("cuda", "float32", H, KVH, HD, PS)


def test_the_k_gather_returns_pages_position_major_and_refuses_foreign_ids():
    pool, *_ = make_case([40])
    k, _ = pool.layer_views()[0]
    which = torch.tensor([7, 3, 200])
    expected = k[which].permute(0, 3, 1, 2).reshape(-1, KVH, HD)
    assert torch.equal(decode_kernel.gather_k_position_major(k, which, H // KVH), expected)
    with pytest.raises(KernelError, match="entry 1 names a page outside the pool"):
        decode_kernel.gather_k_position_major(k, torch.tensor([7, pool.num_pages]), H // KVH)
