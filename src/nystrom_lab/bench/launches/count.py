"""Count the ATen ops a call dispatches: a CPU proxy for GPU kernel launches.

Why ops: on a GPU every non-view ATen op is (at least) one kernel launch, and at MiniLM size the
launches, not the FLOPs, set a fixed cost per layer. Counting needs no GPU: the model runs on the
**meta** device (shapes only, no data), which takes the same code path as CUDA in our library (every
device branch asks "is it the CPU?") and in transformers'.

What counts as one op (see :class:`LaunchCounter`):

* every ATen op the dispatcher reaches, **except** views and metadata-only ops (``view``, ``transpose``,
  ``expand``, ``slice``, ``_unsafe_view``, ``detach``…: no kernel on a GPU) and pure allocations
  (``empty``, ``empty_strided``…: the caching allocator, no kernel), which are reported apart;
* ``F.scaled_dot_product_attention`` as what CUDA runs for it (float32/bf16, head dim ≤ 128, any mask):
  the memory-efficient kernel, 1 op forward (+1 ``where`` that turns a bool mask into a bias) and 1 op
  backward. On meta PyTorch would run its math fallback (≈ 10 ops), which no GPU runs.
* host syncs: whatever makes a GPU's host wait for the device, each recorded with the line that asked:

  - ops that read a device value on the host: ``_local_scalar_dense`` (behind ``.item()``, ``bool(t)``,
    ``int(t)``), ``is_nonzero``, ``equal``, ``allclose``;
  - ops whose output shape depends on the data: ``nonzero``, boolean-mask indexing (``x[mask]``, which
    runs ``nonzero``), ``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``;
  - copies between the host and the device (``.to``, ``.cpu()``, ``.tolist()``, ``torch.tensor`` of host
    data onto the device): a blocking copy waits for the stream;
  - explicit synchronisation: ``torch.cuda.synchronize``, ``torch.accelerator.synchronize``, and
    ``synchronize`` of a CUDA stream or event.

  On meta these cannot run (no values); the counter hands back a stand-in (True/1 for a scalar, every
  element selected for a data-dependent shape, an uninitialised host tensor for a copy) so the count
  goes on past them.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nystrom_lab.bench.launches import host_syncs
from nystrom_lab.bench.launches.host_syncs import (
    SYNCS,
    crosses_host,
    data_dependent,
    explicit_syncs,
    stand_in,
)

#: the counters of the ``counting()`` blocks now open, innermost last: a backward records into the one
#: open when it runs, not the forward's
_ACTIVE: list[LaunchCounter] = []

#: non-view ops whose result shares the input's data or only reads metadata: no kernel
METADATA = {
    "_unsafe_view", "detach", "alias", "lift_fresh", "view", "reshape", "_reshape_alias", "t", "numpy_T",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "set_", "resize_",
    "_propagate_xla_data", "_conj", "_neg_view", "promote_types", "result_type",
}  # fmt: skip
#: allocations without a fill: the caching allocator hands out memory, no kernel runs
ALLOCATIONS = {"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like", "empty_permuted"}


def _name(func: torch._ops.OpOverload) -> str:
    return func.overloadpacket.__name__


class LaunchCounter(TorchDispatchMode):
    """Counts the kernel-launching ops, allocations and host syncs of everything run under it.

    ``ops``/``allocations``/``syncs`` are Counters by op name; ``sync_sites`` holds the innermost
    caller lines of every host sync (to find and remove it)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.allocations: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.sync_sites: list[str] = []
        self._paused = 0

    def record(self, name: str, count: int = 1) -> None:
        """Count ``name`` as ``count`` kernel ops (the modelled fused SDPA)."""
        self.ops[name] += count

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run ops without counting them (the math standing in for a modelled fused kernel)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def record_sync(self, name: str) -> None:
        """Count one host sync of ``name`` at the caller's line."""
        if not self._paused:
            self.syncs[name] += 1
            self.sync_sites.append(_caller())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        crosses = crosses_host(name, args, kwargs)
        if data_dependent(name, args, kwargs) or crosses:
            self.record_sync(f"{name} (host <-> device copy)" if crosses else name)
            if name not in SYNCS and not self._paused:
                self.ops[name] += 1  # the op's own kernel still runs
            standing = stand_in(func, name, args, kwargs)
            if standing is not None:
                return standing
        elif not self._paused:
            if name in ALLOCATIONS:
                self.allocations[name] += 1
            elif not (func.is_view or name in METADATA):
                self.ops[name] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _caller() -> str:
    """The innermost frame outside torch and the counter's modules: where a host sync was asked for."""
    counter_files = (__file__, host_syncs.__file__)
    for frame in reversed(traceback.extract_stack()):
        if "/torch/" not in frame.filename and frame.filename not in counter_files:
            where = frame.filename.rsplit("/site-packages/", 1)[-1].rsplit("/src/", 1)[-1]  # no machine paths
            return f"{where}:{frame.lineno} {frame.line}"
    return "?"


class _FusedSDPA(torch.autograd.Function):
    """SDPA counted as CUDA's memory-efficient kernel: the math runs uncounted, the kernels are recorded."""

    @staticmethod
    def forward(ctx, counter, q, k, v, mask, scale):
        if mask is not None and mask.dtype == torch.bool:
            counter.record("where (SDPA bool mask -> bias)")
        counter.record("_scaled_dot_product_efficient_attention")
        with counter.paused():
            math = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (b, h, m, dv)
            # CUDA's kernel writes a (b, m, h, dv) buffer and returns its head view: later ops see that layout
            b, h, m, dv = math.shape
            out = math.new_empty(b, m, h, dv).transpose(1, 2).copy_(math)
        ctx.save_for_backward(q, k, v, mask)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        counter = _ACTIVE[-1] if _ACTIVE else LaunchCounter()  # a backward outside any count: not counted
        counter.record("_scaled_dot_product_efficient_attention_backward")
        need = ctx.needs_input_grad[1:4]
        with counter.paused(), torch.enable_grad():
            ins = [t.detach().requires_grad_(n) for t, n in zip((q, k, v), need)]
            out = F.scaled_dot_product_attention(*ins, attn_mask=mask, scale=ctx.scale)
            wanted = [t for t, n in zip(ins, need) if n]
            # CUDA's kernel writes each gradient in its input's layout; the math path's may be transposed,
            # which would add a layout copy downstream that no GPU runs
            grads = torch.autograd.grad(out, wanted, grad)
            got = iter([torch.empty_like(t).copy_(g) for t, g in zip(wanted, grads)])
        return (None, *(next(got) if n else None for n in need), None, None)


class _ModelSDPA(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` through :class:`_FusedSDPA`."""

    def __init__(self, counter: LaunchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
            if torch.device(kwargs["device"]).type != "cpu":  # host data copied onto the device
                self.counter.record_sync(f"{func.__name__} (host data -> device)")
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            extra = set(kwargs) - {"attn_mask", "scale"}
            if len(args) > 3 or any(kwargs[key] for key in extra):
                raise NotImplementedError(
                    f"the launch model covers attn_mask and scale only, got {sorted(extra)}"
                )
            return _FusedSDPA.apply(self.counter, q, k, v, kwargs.get("attn_mask"), kwargs.get("scale"))
        return func(*args, **kwargs)


@contextlib.contextmanager
def counting() -> Iterator[LaunchCounter]:
    """``with counting() as c: …``: c counts the ops (SDPA as its fused CUDA kernel) and host syncs."""
    counter = LaunchCounter()
    _ACTIVE.append(counter)
    try:
        with _ModelSDPA(counter), counter, explicit_syncs(counter.record_sync):
            yield counter
    finally:
        _ACTIVE.pop()


def summary(counter: LaunchCounter) -> dict:
    """The counts as plain data: totals and the per-op breakdown (most frequent first)."""
    return {
        "ops": counter.total,
        "allocations": sum(counter.allocations.values()),
        "host_syncs": sum(counter.syncs.values()),
        "by_op": dict(counter.ops.most_common()),
        "sync_sites": sorted(set(counter.sync_sites)),
    }


def count_call(fn: Callable[[], torch.Tensor], *, backward: bool) -> dict:
    """Counts of one ``fn()`` (and, with ``backward``, of its backward with a ones gradient, made outside
    the count)."""
    with counting() as forward:
        out = fn()
    result = {"forward": summary(forward)}
    if backward:
        grad = torch.ones_like(out)
        with counting() as back:
            out.backward(grad)
        both = LaunchCounter()
        for c in (forward, back):
            both.ops.update(c.ops)
            both.allocations.update(c.allocations)
            both.syncs.update(c.syncs)
            both.sync_sites += c.sync_sites
        result["backward"] = summary(back)
        result["forward_backward"] = summary(both)
    return result
