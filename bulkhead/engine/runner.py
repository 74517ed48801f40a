"""The model runner: the only place that turns a step plan into tensors."""

from __future__ import annotations

import array
import contextlib
import math
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from bulkhead.engine.adapter_store import AdapterStore
from bulkhead.engine.step_plan import DecodeWork, PrefillWork, StepPlan
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER
from bulkhead.kv.pool import KVPool
from bulkhead.model.batch import PagedBatch, SequenceSlice
from bulkhead.model.llama import LlamaModel, PassState
from bulkhead.model.lora_rows import LoraRows


class NonFiniteLogits(RuntimeError):
    pass


@dataclass(frozen=True)
class RunnerConfig:
    # Decode rows are padded to a multiple of this and pushed through the
    # linear layers one tile at a time, so a row's result does not depend on
    # its batch-mates (CPU GEMM kernels pick reduction orders by row count).
    # 0 turns batch invariance off.
    decode_tile: int = 16
    # When > 0 (measured at start-up, bulkhead.model.row_invariance): pad
    # decode rows to a multiple of this instead and run each linear layer as
    # one matmul: as batch-invariant where measured, and the weights are read
    # once per step.
    decode_row_multiple: int = 0
    # When > 0, pad prefill rows to a multiple of this: oneDNN caches a
    # kernel per row count, ~2 MB each (measured: +440 MB over 240 prompts of
    # random length, flat with buckets of 32). At most 31 rows of padding.
    prefill_row_bucket: int = 0
    # A step's prefill chunks share one pass, their rows stacked (chunks
    # asking for every row's logits keep their own): two 256-token chunks
    # read the weights once. Only where every kernel a prompt row meets
    # computes each row alone (the builder decides), so batch invariance holds.
    batch_prompts: bool = False
    # Check each step that every page of the plan is its reader's (invariant
    # 5) and that logits are finite; microseconds a step.
    safe_mode: bool = True
    # Steps that only decode, at most this many rows, run on one thread (pass
    # and sampling); 0: torch's threads always. One row's step is bound by
    # reading the weights once, and on 2 cores the control plane's threads
    # (links, router, HTTP) wake for every token and take a core from one of
    # the pass's OpenMP threads while the other waits at the next barrier
    # (Q4_0: 6.7 ms of CPU on one thread against 10.0 ms a token on two).
    # Only where every decode kernel sums alike whatever the thread count.
    single_thread_decode_rows: int = 0


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: KVPool, ledger: PageLedger, config: RunnerConfig,
                 lease: AbstractContextManager | None = None, adapters: AdapterStore | None = None):
        """lease: held around each run, where workers on one host take turns
        with its cores (bulkhead.engine.core_lease); None = never waits.
        adapters: the LoRA weights of the requests that run under one, by digest."""
        self.model = model
        self.adapters = adapters if adapters is not None else \
            AdapterStore(model.config, pack=getattr(model, "adapter_packing", None))
        self.lease = lease if lease is not None else contextlib.nullcontext()
        self.pool = pool
        self.ledger = ledger
        self.config = config
        self.page_size = pool.layout.page_size
        self._layers = pool.layer_views()
        # The last run's chunks with every row's logits (PrefillWork.all_logits):
        # (request id, first position, logits [len(chunk), V]); row j predicts position start + j + 1.
        self.prompt_rows: list[tuple[str, int, torch.Tensor]] = []
        # The last run's greedy pick per row where its one pass was a decode
        # pass whose tail ran in C, else None: the sampler takes them as its argmax.
        self.greedy_picks: list[int] | None = None
        # Sliced passes (pass_slices.py) by request id: the batch and the rows
        # after the last slice ran; dropped when the pass or its request ends.
        self._paused: dict[str, tuple[PagedBatch, PassState]] = {}

    def drop_pass(self, request_id: str) -> None:
        """Forget a sliced pass's paused rows (its request ended mid-pass)."""
        self._paused.pop(request_id, None)

    @property
    def paused_passes(self) -> set[str]:
        return set(self._paused)

    def run(self, plan: StepPlan) -> tuple[list[str], torch.Tensor]:
        """Compute a step. Returns (request ids, logits [len(ids), V]) for the rows to sample.

        A slice of a pass (PrefillWork.layers) runs those layers and keeps
        the rows for the next slice; only the slice that ends the pass has
        logits. Each prefill chunk is its own forward pass (or, under batch_prompts,
        the chunks share one), then the decode rows are one: a row's numbers
        then depend only on its own sequence (prefill rows padded to a
        bucket, decode rows tiled or padded to a measured multiple), never on
        which other chunks share the step. Mixing decode rows into a prefill
        pass would put them through prefill-shaped matmuls whose reduction
        order changes with the row count."""
        with self.lease:
            return self._run(plan)

    def _run(self, plan: StepPlan) -> tuple[list[str], torch.Tensor]:
        if self.config.safe_mode:
            self.check_ownership(plan)
        ids: list[str] = []
        parts: list[torch.Tensor] = []
        prompt_rows: list[tuple[str, int, torch.Tensor]] = []
        tails: list = []  # the decode pass's decode_layers.StepTail, where its tail ran in C
        self.greedy_picks = None
        passes = self._prefill_passes(plan.prefills) + ([list(plan.decode)] if plan.decode else [])
        for works in passes:
            prefill = isinstance(works[0], PrefillWork)
            if prefill and works[0].layers is not None:
                batch, pass_ids, logits = self._run_slice(works[0])
                if logits is None:
                    continue  # the pass goes on in a later step
            else:
                batch, pass_ids = self._build_batch(works)
                logits = self._forward(batch, tails)
            if prefill and works[0].all_logits:
                prompt_rows.append((works[0].request_id, works[0].start, logits))
                logits = logits[-1:]  # the chunk's last row: the sampling row, if it samples
            logits = logits[: len(pass_ids)]
            if pass_ids:
                ids += pass_ids
                parts.append(logits)
        self.prompt_rows = prompt_rows
        if not parts:
            return ids, torch.empty(0, 0)  # nothing to sample (a slice that does not end its pass)
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        tail = tails[0] if tails and len(parts) == 1 else None  # the step is that decode pass alone
        # One sum instead of isfinite(): any NaN or inf makes the sum non-finite
        # (1.2 vs 0.03 ms for 16 rows of a 49k vocabulary, measured).
        # A sum of finite logits overflowing would also trip it: a false
        # alarm that fails closed. The C tail checks each value instead.
        if self.config.safe_mode and not all(torch.isfinite(x.sum()) for _, _, x in self.prompt_rows):
            raise NonFiniteLogits(f"non-finite prompt logits for {[rid for rid, _, _ in self.prompt_rows]}")
        if self.config.safe_mode and not (tail.finite if tail is not None else math.isfinite(logits.sum().item())):
            # Only a read of KV nobody wrote for this request (poisoned with
            # NaN in tests) or corrupted pages produce this: fail closed.
            raise NonFiniteLogits(f"non-finite logits for {ids}")
        self.greedy_picks = tail.picks if tail is not None else None
        return ids, logits

    def _forward(self, batch: PagedBatch, tails: list) -> torch.Tensor:
        """The pass's logits; a decode pass whose tail runs in C
        (LlamaModel.decode_tail_in_c) also appends its StepTail to tails."""
        if batch.decode and getattr(self.model, "decode_tail_in_c", False):  # a stand-in model has none
            return self.model.forward(batch, self._layers, tails)
        return self.model.forward(batch, self._layers)

    def threads_for(self, plan: StepPlan) -> AbstractContextManager:
        """Held around a step's run and sampling: one thread where the step
        only decodes few rows (RunnerConfig.single_thread_decode_rows), else
        torch's threads. The sampling too: its argmax and the finite check
        over the vocabulary woke the second thread, which then spun."""
        if plan.prefills or not plan.decode or len(plan.decode) > self.config.single_thread_decode_rows:
            return contextlib.nullcontext()
        return _one_thread()

    def _run_slice(self, work: PrefillWork) -> tuple[PagedBatch, list[str], torch.Tensor | None]:
        """Layers work.layers of work's pass, from its first layer or from
        where its last slice paused; logits only when the slice ends the pass."""
        first, stop = work.layers
        if first == 0:
            batch, ids = self._build_batch([work])
            state = self.model.start_pass(batch)
        else:
            batch, state = self._paused.pop(work.request_id)
            ids = [work.request_id] if work.samples else []
        state = self.model.run_layers(batch, self._layers, state, first, stop)
        if not work.ends_pass:
            self._paused[work.request_id] = (batch, state)
            return batch, ids, None
        return batch, ids, self.model.finish_pass(batch, state)

    def _prefill_passes(self, chunks: tuple[PrefillWork, ...]) -> list[list[PrefillWork]]:
        """The step's prefill chunks as passes: one each, or (batch_prompts)
        one for every whole chunk but those asking for every row's logits.
        A slice is always a pass of its own."""
        if not self.config.batch_prompts:
            return [[w] for w in chunks]
        shared = [w for w in chunks if not w.all_logits and w.layers is None]
        return ([shared] if shared else []) + [[w] for w in chunks if w.all_logits or w.layers is not None]

    def check_ownership(self, plan: StepPlan) -> None:
        # Each page is the request's own, or a prefix-cache page of its tenant.
        for w in [*plan.prefills, *plan.decode]:
            self.ledger.check_readable(w.request_id, w.tenant, list(w.pages), CACHE_OWNER)

    def _build_batch(self, works: list[PrefillWork] | list[DecodeWork]) -> tuple[PagedBatch, list[str]]:
        """One forward pass: prefill chunks (one, or several under
        batch_prompts, rows stacked in order), or decode rows."""
        rows = _BatchRows(self.page_size, self.adapters)
        tile = 0
        decode = not isinstance(works[0], PrefillWork)
        if not decode:
            if len(works) != 1 and (not self.config.batch_prompts or any(w.all_logits for w in works)):
                raise ValueError(f"a prefill pass computes one chunk here, not {len(works)}")
            for w in works:
                rows.add_sequence(w.request_id, w.start, w.token_ids, w.pages, w.samples, w.adapter)
            if works[0].all_logits:  # every row of the chunk, in order (the sampling row is the last)
                rows.logit_rows = list(range(len(rows.tokens)))
            multiple = self.config.prefill_row_bucket
        else:
            for w in works:
                rows.add_sequence(w.request_id, w.position, (w.token_id,), w.pages, True, w.adapter)
            multiple = self.config.decode_row_multiple or self.config.decode_tile
            tile = 0 if self.config.decode_row_multiple else self.config.decode_tile
        if multiple:
            rows.pad_to_multiple(multiple, decode)
        return rows.batch(tile, decode), rows.ids


@contextlib.contextmanager
def _one_thread():
    # torch.get_num_threads() is also what the C kernels are handed (0.1 us a switch).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _BatchRows:
    """The rows of one forward pass as they are gathered, sequence by sequence."""

    def __init__(self, page_size: int, adapters: AdapterStore):
        self.page_size = page_size
        self.adapters = adapters
        self.row_adapters: list = []  # each row's LoRA weights, None for the base model's (and padding)
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.slots: list[int] = []
        self.pages: list[int] = []
        self.seqs: list[SequenceSlice] = []
        self.logit_rows: list[int] = []
        self.ids: list[str] = []  # the requests sampled, in logit row order

    def add_sequence(self, request_id: str, start: int, seq_tokens, seq_pages, wants_logits: bool,
                     adapter: str | None) -> None:
        ps = self.page_size
        row = len(self.tokens)
        self.row_adapters.extend([self.adapters.get(adapter) if adapter else None] * len(seq_tokens))
        for i, tok in enumerate(seq_tokens):
            pos = start + i
            self.tokens.append(tok)
            self.positions.append(pos)
            self.slots.append(seq_pages[pos // ps] * ps + pos % ps)
        kv_len = start + len(seq_tokens)
        used = -(-kv_len // ps)
        self.seqs.append(SequenceSlice(row, len(self.tokens), kv_len, len(self.pages), used))
        self.pages.extend(seq_pages[:used])
        if wants_logits:
            self.logit_rows.append(len(self.tokens) - 1)
            self.ids.append(request_id)

    def pad_to_multiple(self, multiple: int, decode: bool) -> None:
        # Padding rows: token 0 at position 0; they write no KV, belong to
        # no sequence (attention skips them) and are never sampled. A
        # decode batch's lm_head sees them too, so its row count stays
        # one that was measured (or tiled) to be batch-invariant.
        padded = -(-len(self.tokens) // multiple) * multiple
        pad = padded - len(self.tokens)
        self.tokens.extend([0] * pad)
        self.positions.extend([0] * pad)
        if decode:
            self.logit_rows = list(range(padded))

    def batch(self, tile: int, decode: bool) -> PagedBatch:
        # One int64 tensor for every index list, each field a contiguous 1-D
        # slice of it, read from an array's buffer: torch.tensor(list) took
        # 12 us for 40 ints, seven times a step, in a decode step's Python.
        lists = [self.tokens, self.positions, self.slots, self.pages, self.logit_rows]
        if decode:
            lists += [[s.page_offset for s in self.seqs], [s.kv_len for s in self.seqs]]
        flat = torch.frombuffer(array.array("q", [v for xs in lists for v in xs]), dtype=torch.long)
        token_ids, positions, slots, pages, logit_rows, *per_seq = flat.split([len(xs) for xs in lists])
        return PagedBatch(
            token_ids=token_ids,
            positions=positions,
            write_slots=slots,
            pages=pages,
            sequences=tuple(self.seqs),
            logit_rows=logit_rows,
            row_tile=tile,
            decode=decode,
            decode_page_offset=per_seq[0] if decode else None,
            decode_kv_len=per_seq[1] if decode else None,
            lora=LoraRows.of(self.row_adapters),
        )
