"""Float64 oracles written plainly, per sample and per head, independent of the library's code paths.

Legend: b batch, h heads, n tokens, m landmarks, d head dim.

The pseudo-inverse is the one exception: its iterations are the op's own plain reference
(:func:`nystrom.ops.pinv.naive.reference_pinv`, one matrix at a time here, so Z₀ is per matrix), which
every implementation of the op is tested against. :class:`DispatchedOps` records which aten ops a path
runs, for tests of how (not only what) it computes.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nystrom.ops.pinv.naive import reference_pinv


def softmax_oracle(q, k, v, mask=None):
    """Exact softmax attention in float64: (b, h, n, d) -> (b, h, n, dv); padded keys excluded."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.mT / math.sqrt(q.shape[-1])  # (b, h, n, n)
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(s, -1) @ v


def landmarks_oracle(x, m, mask=None):
    """Per sample: real tokens ranked r = 0..L-1 go to landmark floor(r*m/L). Returns list of (h, m_valid, d), idx."""
    out = []
    b, h, n, d = x.shape
    for i in range(b):
        real = list(range(n)) if mask is None else [t for t in range(n) if mask[i, t]]
        L = len(real)
        groups: dict[int, list[int]] = {}
        for r, t in enumerate(real):
            groups.setdefault(math.floor(r * m / L), []).append(t)
        idx = sorted(groups)
        lm = torch.stack([x[i][:, groups[j]].double().mean(1) for j in idx], 1)  # (h, m_valid, d)
        out.append((lm, idx))
    return out


def nystrom_oracle(q, k, v, m, mask=None, pinv="exact", iters=6):
    """Nyström formula materialised per sample/head in float64: F A⁺ B V (b, h, n, dv)."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, n, d = q.shape
    scale = 1 / math.sqrt(d)
    qls, kls = landmarks_oracle(q, m, mask), landmarks_oracle(k, m, mask)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for i in range(b):
        real = torch.ones(n, dtype=torch.bool) if mask is None else mask[i]
        for j in range(h):
            ql, kl = qls[i][0][j], kls[i][0][j]  # (m_valid, d)
            f = torch.softmax(q[i, j] @ kl.T * scale, -1)  # (n, mv)
            a = torch.softmax(ql @ kl.T * scale, -1)  # (mv, mv)
            bm = torch.softmax((ql @ k[i, j][real].T) * scale, -1)  # (mv, L)
            z = torch.linalg.pinv(a) if pinv == "exact" else reference_pinv(a, iters, per_matrix=True)
            out[i, j] = f @ z @ (bm @ v[i, j][real])
    return out


def linear_oracle(q, k, v, mask=None):
    """ELU linear attention in float64 from its definition, per sample, head and query (a loop over the
    real keys): out_i = sum_j (phi(q_i)·phi(k_j)) v_j / sum_j phi(q_i)·phi(k_j), phi(x) = elu(x) + 1."""
    q, k, v = q.double(), k.double(), v.double()

    def phi(x):
        return torch.where(x > 0, x + 1, torch.exp(x))  # elu(x) + 1 written out

    b, h, n, _ = q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for i in range(b):
        real = [t for t in range(n) if mask is None or bool(mask[i, t])]
        for j in range(h):
            for t in range(n):
                w = torch.stack([phi(q[i, j, t]) @ phi(k[i, j, s]) for s in real])  # (L,)
                out[i, j, t] = (w[:, None] * v[i, j, real]).sum(0) / w.sum()
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def right_pad_mask(lengths, n):
    """bool (b, n): True for the first lengths[i] tokens."""
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


class DispatchedOps(TorchDispatchMode):
    """Records every aten op run inside it, as (name, args): which ops a path takes, and on what."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def names(self):
        return [name for name, _ in self.calls]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.overloadpacket.__name__, args))
        return func(*args, **(kwargs or {}))
