"""The kernels' names and what each computes in, without torch: the command
line, the engine's config and the router (which holds no model and never
imports torch) read them here; the kernel modules re-export them
(bulkhead.model.linear_kernel and the attention and glue modules document
each one)."""

# "exact" is the exact fp32 path, `--precision exact`: it resolves to onednn
# (aten without oneDNN). bulkhead.model.kernel_table says which "auto" picks.
KERNELS = ("auto", "exact", "onednn", "aten", "q4", "q4-i16in", "bf16", "gguf-i16in")
EXACT_KERNELS = ("onednn", "aten")
# The kernels whose prompts round their inputs to bf16 (bf16in_kernel), and
# the 4-bit grid ones (q4_kernel's packing); the engine keys prompt padding
# and prompt attention on the first.
BF16_INPUT_PROMPTS = ("q4-i16in", "bf16", "gguf-i16in")
Q4_KERNELS = ("q4", "q4-i16in")
# The kernels that are not the exact fp32 model (their lm_head may take bf16w).
REDUCED = ("q4", "q4-i16in", "bf16", "gguf-i16in")
# What an engine's passes run, so what its weights are laid out for
# (linear_kernel.prepare): "both" (colocated), "prompts" (a prefill worker:
# the prompt kernel's packing only), "decode" (a decode worker: the decode
# packing only; the prompts it recomputes after a preemption run the decode
# kernel, format_linear.CodedLinear's docstring says why).
RUNS = ("both", "prompts", "decode")
HEAD_KERNELS = ("fp32", "bf16w", "bf16-in", "q8-i16in")
# lm_head kernels that run each row alone, the same operations whatever its
# batch mates (Q8I16InLinear, BF16WeightLinear, BF16InputHead); fp32's oneDNN GEMM does not.
ROW_BY_ROW_HEADS = ("q8-i16in", "bf16w", "bf16-in")
# What /server_info says each kernel computes in (the lm_head: HEAD_PRECISION).
MATMUL_PRECISION = {"aten": "fp32", "onednn": "fp32",
                    "q4": "fp32 (decode rows read the 4-bit weights, rebuilt exactly)",
                    "q4-i16in": "prompts bf16 inputs and weights, fp32 sums and outputs; decode rows inputs as "
                                "16-bit integers per group of 32, 4-bit weights rebuilt exactly, exact int32 sums, "
                                "fp32 scales (read as the file's fp16 for Q4_0 and Q4_1)",
                    "gguf-i16in": "each tensor group's GGUF codes as stored (4-bit, 8-bit, 8-bit with a scale per "
                                  "16); prompts bf16 inputs and weights, fp32 sums and outputs; decode rows inputs "
                                  "as 16-bit integers per group of 32, exact int32 sums, fp32 scales",
                    "bf16": "the checkpoint's bf16 weights as stored; prompts and decode rows bf16 inputs, fp32 sums "
                            "and outputs"}
HEAD_PRECISION = {"fp32": "lm_head fp32",
                  "bf16w": "lm_head bf16 weights, fp32 inputs, accumulation and logits",
                  "bf16-in": "lm_head bf16 weights, inputs rounded to bf16, fp32 accumulation and logits",
                  "q8-i16in": "lm_head 8-bit weights rebuilt exactly, inputs as 16-bit integers per group of 32, "
                              "exact int32 sums, fp32 scales and logits"}

# --precision: auto = the kernel table's pick; exact = the fp32 reference
# everywhere (linear kernel "exact", lm_head fp32, a float32 KV cache).
PRECISIONS = ("auto", "exact")
# --decode-attention, --decode-glue, --prefill-attention and --prefill-glue.
DECODE_ATTENTION = ("auto", "c", "torch")  # bulkhead.model.decode_kernel
DECODE_GLUE = ("auto", "c", "torch")  # bulkhead.model.decode_layers (LlamaModel's decode_glue)
PREFILL_ATTENTION = ("auto", "bf16", "torch")  # bulkhead.model.prefill_attention
PREFILL_GLUE = ("auto", "c", "torch")  # bulkhead.model.prefill_glue
