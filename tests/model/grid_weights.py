"""Weights on a 4-bit grid, as a Q4_1 GGUF dequantizes them, for the tests of
the kernels that read them (q4_kernel, bf16in_kernel, i16in_kernel), and
weights on an 8-bit grid, as a Q8_0 GGUF dequantizes them."""

import torch


def gguf_q4_1(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as a Q4_1 GGUF dequantizes them: per group of 32 inputs,
    q * d + m in fp32 with d and m stored in fp16, q in 0..15, both ends used
    (every output's q is 0 at each group's input 0 and 15 at its input 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01).half().float()
    m = (torch.randn(n, k // 32, 1, generator=gen) * 0.05).half().float()
    return (q * d + m).reshape(n, k)


def one_layer_model(make):
    """A one-layer ModelWeights whose linear weights are make(n, k)."""
    from bulkhead.model.llama import LayerWeights, ModelWeights

    layer = LayerWeights(torch.ones(64), make(96, 64), None, make(64, 64), torch.ones(64), make(128, 64), make(64, 64))
    return ModelWeights(torch.zeros(10, 64), [layer], torch.ones(64), torch.zeros(10, 64))


def gguf_q8_0(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as a Q8_0 GGUF dequantizes them: per group of 32 inputs, q * d
    in fp32 with d stored in fp16, q in -127..127 and some |q| 127 (the
    quantizer's d is the group's max |w| / 127)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n, k // 32, 32), generator=gen).float()
    q[..., 0] = 127
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01).half().float()
    return (q * d).reshape(n, k)
