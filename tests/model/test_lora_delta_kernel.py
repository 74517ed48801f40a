"""csrc/lora_delta.c's lora_layer_delta on its own, over the packed weights
of bulkhead.model.lora_layers, in each arithmetic: fp32 products (register
tiles), bf16 products (vdpbf16ps) and int8 weights with int16 products
(vpdpwssd), the last two where the CPU has them. Each computes what it
says it rounds, and a row's numbers do not depend on which rows, tiles or
adapters share its call."""

import pytest
import torch

from bench.lora_adapters import write_adapter
from bulkhead.lora.peft_files import BaseShapes, read_adapter, read_weights
from bulkhead.model import lora_layers
from bulkhead.model.config import load_model_config
from bulkhead.model.lora_rows import LoraRows
from bulkhead.model.lora_weights import FusedDelta, LoraWeights, ModuleB

LIB = lora_layers.load()
pytestmark = pytest.mark.skipif(LIB is None, reason="the C LoRA delta cannot be built here")
PRODUCTS = ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(
    LIB is None or not LIB.lora_bf16_dots(), reason="no AVX-512 BF16 here")),
    pytest.param("int8", marks=pytest.mark.skipif(LIB is None or not LIB.lora_int8(), reason="no AVX-512 VNNI here"))]


@pytest.fixture(scope="module")
def weights(tiny_model_dir, tmp_path_factory):
    """(config, {products: [adapter of rank 16, adapter of odd rank 3]}), each packed for one arithmetic."""
    config = load_model_config(tiny_model_dir)
    shapes, root = BaseShapes.of(config), tmp_path_factory.mktemp("adapters")
    out = {}
    for products in ("fp32", "bf16", "int8"):
        out[products] = []
        for i, rank in enumerate((16, 3)):
            path = write_adapter(root / f"a{i}", shapes, rank=rank, alpha=2 * rank, seed=i, scale=0.2,
                                 dtype=torch.bfloat16)
            data = read_weights(path)
            w = LoraWeights.load(read_adapter(path, shapes, data=data), config, data)
            w.packed.append(lora_layers.PackedAdapter(w, products))
            out[products].append(w)
    return config, out


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


def _delta(row_adapters, layer, linear, x, y0):
    y = y0.clone()
    lora_layers.StepDeltas(LIB, LoraRows.of(row_adapters)).add(layer, linear, x, y)
    return y


def _int16(t: torch.Tensor) -> torch.Tensor:
    """t's rows in int16 steps of max |row| / 32767, as lora_delta_int8.h's quantize_i16 rounds them."""
    amax = t.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 32767 / amax, 0)
    return (t * inv).round().double() * (amax / 32767).double()


def _int8_reference(d, x):
    """lora_delta_int8.h's sums in float64: u = (A's and B's rank scales) * sx * qa . xq,
    then each part's u in int16 steps times qb (B's integer steps, per rank scale folded into u)."""
    qa, sa = lora_layers._int8_rows(d.a)
    u = _int16(x) @ qa.double().T * sa.double()
    out = torch.zeros(x.shape[0], max(p.cols[1] for p in d.parts), dtype=torch.float64)
    for p in d.parts:
        qbt, sb = lora_layers._int8_rows(p.b.t())
        scaled = (u[:, p.ranks[0]:p.ranks[1]] * sb.double()).float()
        out[:, p.cols[0]:p.cols[1]] = _int16(scaled) @ qbt.double()
    return out


def _reference(adapter, layer, linear, x, products):
    """The delta in float64 from the packed weights, rounding what the arithmetic rounds."""
    d = adapter.layers[layer][linear]
    if products == "int8":
        return _int8_reference(d, x)
    pairs = products == "bf16"
    a = _bf16(d.a)
    xr = _bf16(x) if pairs else x.double()
    u = xr @ a.T
    out = torch.zeros(x.shape[0], max(p.cols[1] for p in d.parts), dtype=torch.float64)
    for p in d.parts:
        up = u[:, p.ranks[0]:p.ranks[1]]
        out[:, p.cols[0]:p.cols[1]] = (_bf16(up) if pairs else up) @ _bf16(p.b).T
    return out


@pytest.mark.parametrize("products", PRODUCTS)
@pytest.mark.parametrize("linear", lora_layers.LINEARS)
def test_each_arithmetic_computes_the_delta_it_documents(weights, products, linear):
    config, packed = weights
    gen = torch.Generator().manual_seed(1)
    for adapter in packed[products]:  # rank 16, and rank 3: an odd rank's last pair padded
        d = adapter.layers[1][linear]
        x = torch.randn(9, d.a.shape[1], generator=gen)
        out = max(p.cols[1] for p in d.parts)
        y = _delta([adapter] * 9, 1, linear, x, torch.zeros(9, out))
        ref = _reference(adapter, 1, linear, x, products)
        # int8: u is fp32 in C and float64 here, so its int16 rounding may differ by one step at a tie
        tol = 1e-5 if products != "int8" else 1e-4 * ref.abs().max().item()
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=tol), (y.double() - ref).abs().max()


@pytest.mark.parametrize("linear", lora_layers.LINEARS)
def test_int8_weights_stay_within_their_bound_of_the_exact_delta(weights, linear):
    """Half the bytes of bf16 for a bounded error: each weight within half a
    step (max |row| / 254) of the exact one, x and u within half an int16
    step; on these random adapters the delta's max error is about 1% of its
    largest value (bf16 products: about 0.25%). docs/adapters.md, "Bounds"."""
    if LIB is None or not LIB.lora_int8():
        pytest.skip("no AVX-512 VNNI here")
    config, packed = weights
    gen = torch.Generator().manual_seed(3)
    for adapter in packed["int8"]:
        d = adapter.layers[1][linear]
        x = torch.randn(16, d.a.shape[1], generator=gen)
        out = max(p.cols[1] for p in d.parts)
        y = _delta([adapter] * 16, 1, linear, x, torch.zeros(16, out)).double()
        exact = torch.zeros_like(y)
        u = x.double() @ d.a.double().T
        for p in d.parts:
            exact[:, p.cols[0]:p.cols[1]] = u[:, p.ranks[0]:p.ranks[1]] @ p.b.double().T
        assert (y - exact).abs().max() <= 0.03 * exact.abs().max(), (y - exact).abs().max() / exact.abs().max()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("products", PRODUCTS)
def test_a_rows_delta_does_not_depend_on_its_neighbours_tiles_or_threads(weights, products, threads):
    """Row 0 under adapter 0 alone, then in a group of 7 (a whole tile of 4
    and a remainder) beside base rows and the other adapter's rows."""
    config, packed = weights
    a0, a1 = packed[products]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(2)
        for linear in lora_layers.LINEARS:
            d = a0.layers[0][linear]
            out = max(p.cols[1] for p in d.parts)
            x, y0 = torch.randn(12, d.a.shape[1], generator=gen), torch.randn(12, out, generator=gen)
            alone = _delta([a0], 0, linear, x[:1], y0[:1])
            mixed = [a0, None, a1, a0, a0, a1, a0, None, a0, a0, a1, a0]
            together = _delta(mixed, 0, linear, x, y0)
            assert torch.equal(alone[0], together[0]), linear
            for j in (3, 11):  # the same inputs at other places in the group give the same numbers
                xs, ys = x.clone(), y0.clone()
                xs[j], ys[j] = x[0], y0[0]
                assert torch.equal(_delta(mixed, 0, linear, xs, ys)[j], alone[0]), (linear, j)
            assert torch.equal(together[1], y0[1])  # a base row is untouched
    finally:
        torch.set_num_threads(previous)


def test_int8_weights_lie_in_one_stream_in_the_order_a_step_reads_them(weights):
    """Layer by layer, linear by linear (LINEARS: decode_layers.c's order), A then each module's B, with
    nothing between: what the delta reads next is what follows in memory (csrc/lora_delta_int8.h)."""
    config, packed = weights
    for adapter in packed["int8"]:
        p = adapter.packed[0]
        at = p.stream.data_ptr()
        for d in p.deltas:
            if d.rank == 0:
                continue
            assert d.a == at
            at += (d.in_f + 1) // 2 * d.rank * 2
            for part in d.parts[:d.n_parts]:
                assert part.bt == at
                at += (part.r_len + 1) // 2 * part.out * 2
        assert at == p.stream.data_ptr() + p.stream.numel() and p.nbytes == p.stream.nbytes + 4 * sum(
            d.rank for d in p.deltas)


def _odd_delta(gen):
    """One fused linear whose parts span two whole column blocks and a narrow one (160 = 64 + 64 + 32) and a
    block and an odd one (70 = 64 + 6), of odd ranks, over an odd input width."""
    a = torch.randn(8, 71, generator=gen)
    parts = (ModuleB((0, 160), (0, 3), torch.randn(160, 3, generator=gen)),
             ModuleB((200, 270), (3, 8), torch.randn(70, 5, generator=gen)))
    return LoraWeights("odd", ({"qkv": FusedDelta(a, parts)},), 0)


@pytest.mark.parametrize("rows", [1, 5])  # one row alone; a tile of 4 and one more
def test_int8_b_is_read_block_by_block_whatever_its_width(rows):
    if LIB is None or not LIB.lora_int8():
        pytest.skip("no AVX-512 VNNI here")
    gen = torch.Generator().manual_seed(4)
    adapter = _odd_delta(gen)
    adapter.packed.append(lora_layers.PackedAdapter(adapter, "int8"))
    x, y0 = torch.randn(rows, 71, generator=gen), torch.zeros(rows, 270)
    y = _delta([adapter] * rows, 0, "qkv", x, y0).double()
    ref = _int8_reference(adapter.layers[0]["qkv"], x)
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item()), (y - ref).abs().max()
    assert torch.equal(y[:, 160:200], torch.zeros(rows, 40, dtype=torch.float64))  # between the parts: untouched


def test_the_int8_stream_starts_on_a_huge_page(weights):
    """As the base model's weights: on 4 KiB pages the prefetcher stops at every page (lora_layers)."""
    from bulkhead.kv.huge_pages import HUGE_PAGE

    config, packed = weights
    for adapter in packed["int8"]:
        assert adapter.packed[0].stream.data_ptr() % HUGE_PAGE == 0


@pytest.mark.parametrize("products", PRODUCTS)
def test_a_step_reused_for_the_same_rows_gets_a_fresh_steps_numbers_whatever_its_scratch_held(weights, products):
    """lora_layers.step_deltas hands a step the last step's tables where its
    rows and adapter are the same. An odd rank's last pair reads the 16-bit
    u one past its ranks against a 0 weight: left as an earlier step's row
    wrote it (here a bf16 NaN pattern in every slot), a bf16 product would
    make the row NaN; the reused step's numbers are a fresh one's."""
    config, by = weights
    odd = by[products][1]  # rank 3
    d = odd.layers[0]["o"]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, d.a.shape[1], generator=g)
    y0 = torch.randn(1, max(p.cols[1] for p in d.parts), generator=g)
    fresh = _delta([odd], 0, "o", x, y0)
    first = lora_layers.step_deltas(LIB, LoraRows.of([odd]))
    first._ub.fill_(0x7FC0)  # a bf16 NaN in each 16-bit u
    again = lora_layers.step_deltas(LIB, LoraRows.of([odd]))
    assert again is first
    y = y0.clone()
    again.add(0, "o", x, y)
    assert torch.equal(y, fresh)
    other = lora_layers.step_deltas(LIB, LoraRows.of([None, odd]))  # another row: its own tables
    assert other is not first
