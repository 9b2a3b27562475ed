"""Replay a model's inference forward as CUDA graphs, one per (batch, length bucket).

Legend: b batch, n tokens of a call, N its bucket (the smallest bucket length ≥ n).

Why: even at ~170 launches per forward (docs/gpu/launches.md) a short-input GPU forward is bound by
launch latency; a CUDA graph replays all of them as one. A graph is fixed to its input shapes, so
lengths are rounded up to a few buckets: the input is right-padded to N with ``pad_token_id`` and a
padding mask, which changes no real token's output (Nyström landmarks and the conv skip ignore padded
tokens exactly), and the output is cut back to n.

A graph reads the parameters where they lay when it was captured. In-place updates (an optimiser step,
``load_state_dict``) are seen by the next replay; a parameter or buffer that was *replaced* (``.to()``,
a new ``nn.Parameter``), a train/eval switch or a new device invalidates every graph, and the next call
captures afresh: a stale graph is never replayed. The bookkeeping is separate from the capture
(:class:`CudaGraphs` vs :class:`Eager`), so it is tested on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

#: ``forward(input_ids (b, N), attention_mask (b, N)) -> (b, N, ...)``
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket length ≥ ``n``; raises for an ``n`` above the largest (no silent eager run)."""
    fits = [b for b in buckets if b >= n]
    if n < 1 or not fits:
        raise ValueError(
            f"length {n} fits no bucket of {tuple(buckets)}: give buckets up to the longest input"
        )
    return min(fits)


@dataclass
class Captured:
    """One captured forward: its static input buffers, its output buffer and how to run it again."""

    ids: torch.Tensor  # (b, N)
    mask: torch.Tensor  # (b, N)
    output: torch.Tensor  # (b, N, ...)
    replay: Callable[[], None]


class Eager:
    """Capture by running once, replay by running again on the static buffers: the bookkeeping of
    :class:`GraphedForward` without a graph (CPU, tests, debugging)."""

    def capture(self, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        out = run()
        return out, lambda: out.copy_(run())


class CudaGraphs:
    """Capture with ``torch.cuda.CUDAGraph`` after ``warmup`` runs on a side stream (as PyTorch requires).

    The warm-up runs are also the first launches of every kernel the forward takes at this shape, the
    fused Triton kernels' included: a first launch compiles the kernel, loads its module and may grow the
    context's local-memory reservation to the kernel's spill stack (a device-wide synchronisation;
    docs/gpu/kernel_resources.md), none of which belongs in a capture. So ``warmup`` is at least 1."""

    def __init__(self, *, warmup: int = 2) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup must be an int ≥ 1 (the kernels' first launches happen there), got {warmup!r}")
        self.warmup = warmup
        self.pool = None  # one memory pool shared by this runner's graphs

    def capture(self, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run()
        self.pool = graph.pool()
        return out, graph.replay


def signature(module: nn.Module) -> tuple[Hashable, ...]:
    """What a captured graph depends on besides values: every parameter's and buffer's storage, shape,
    dtype and device, and the train/eval mode."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return (
        module.training,
        *((name, t.data_ptr(), tuple(t.shape), t.dtype, str(t.device)) for name, t in tensors),
    )


class GraphedForward:
    """``runner(input_ids, attention_mask=None) -> (b, n, ...)``: the model's forward, replayed.

    Args:
        module: the model (its parameters decide when graphs go stale).
        forward: ``forward(input_ids, attention_mask)`` -> a tensor (b, N, ...), e.g.
            ``lambda i, m: model(input_ids=i, attention_mask=m).last_hidden_state``.
        buckets: the lengths graphs are captured for (each call is padded to the smallest that fits).
        pad_token_id: the id written into padded positions.
        backend: :class:`CudaGraphs` (default) or :class:`Eager`.

    Inference only (raises under autograd). Returns a fresh tensor, not the graph's output buffer, which
    the next replay overwrites.
    """

    def __init__(self, module: nn.Module, forward: Forward, *, buckets: Sequence[int], pad_token_id: int = 0,
                 backend: CudaGraphs | Eager | None = None) -> None:  # fmt: skip
        if not buckets or any(not isinstance(b, int) or b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive ints, got {buckets!r}")
        self.module, self.forward = module, forward
        self.buckets = tuple(sorted(set(buckets)))
        self.pad_token_id = pad_token_id
        self.backend = CudaGraphs() if backend is None else backend
        self.graphs: dict[tuple[Hashable, ...], Captured] = {}
        self.captures = 0  # how many graphs were captured (stale ones re-captured included)
        self._signature: tuple[Hashable, ...] | None = None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("GraphedForward replays inference only: call it under torch.inference_mode()")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, tokens), got {tuple(input_ids.shape)}")
        b, n = input_ids.shape
        if attention_mask is not None and tuple(attention_mask.shape) != (b, n):
            raise ValueError(f"attention_mask must be ({b}, {n}), got {tuple(attention_mask.shape)}")
        now = signature(self.module)
        if now != self._signature:  # a parameter replaced, a mode switched: every graph is stale
            self.graphs.clear()
            self._signature = now
        size = bucket(n, self.buckets)
        key = (b, size, input_ids.dtype, str(input_ids.device))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(b, size, input_ids)
        graph.ids[:, :n].copy_(input_ids)
        graph.ids[:, n:].fill_(self.pad_token_id)
        if attention_mask is None:
            graph.mask[:, :n].fill_(1)
        else:
            graph.mask[:, :n].copy_(attention_mask)
        graph.mask[:, n:].zero_()
        graph.replay()
        return graph.output[:, :n].clone()

    def _capture(self, b: int, size: int, like: torch.Tensor) -> Captured:
        ids = torch.full((b, size), self.pad_token_id, dtype=like.dtype, device=like.device)
        mask = torch.ones(b, size, dtype=torch.long, device=like.device)  # (b, N): a real mask, as in replays
        output, replay = self.backend.capture(lambda: self.forward(ids, mask))
        self.captures += 1
        return Captured(ids, mask, output, replay)
