"""The tied embedding read from the lm_head's 8-bit packing gives every
token the fp32 row, bit for bit, and replaces the fp32 copy (113 MB a worker)."""

import pytest
import torch

from bulkhead.model import head_linear, i16in_kernel, linear_kernel
from bulkhead.model.loader import load_weights
from bulkhead.model.q8_embedding import Q8Embedding
from tests.model.grid_weights import gguf_q8_0


def test_every_row_rebuilt_from_the_packing_is_the_fp32_row():
    w = gguf_q8_0(96, 64)
    embedding = Q8Embedding(head_linear.pack_q8_0(w))
    assert embedding.shape == w.shape and embedding.dtype == torch.float32
    ids = torch.tensor([5, 0, 95, 31, 32, 5, 63])
    assert torch.equal(embedding[ids], w[ids])
    assert torch.equal(embedding[torch.arange(96)], w)


def test_one_token_lookup_is_the_same_row():
    # A decode step embeds one token through plain indexing (Q8Embedding._one).
    w = gguf_q8_0(96, 64)
    embedding = Q8Embedding(head_linear.pack_q8_0(w))
    for t in (0, 5, 31, 32, 63, 95):
        row = embedding[torch.tensor([t])]
        assert row.shape == (1, 64) and torch.equal(row, w[t:t + 1])


def test_smollm2_under_q8_i16in_keeps_no_fp32_embedding_and_looks_up_the_same_rows(smollm2_dir):
    if i16in_kernel.load() is None:
        pytest.skip("no AVX-512 VNNI here: the lm_head is not q8-i16in")
    _, weights = load_weights(smollm2_dir)
    fp32 = weights.embed
    laid = linear_kernel.prepare(weights, "q4-i16in")
    assert isinstance(laid.embed, Q8Embedding)
    assert torch.equal(laid.embed[torch.arange(fp32.shape[0])], fp32)
