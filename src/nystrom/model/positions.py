"""Extending a learned absolute position table from L rows to N: the schemes of :func:`to_long`.

Legend: L rows of the source table (its length), N rows wanted, e hidden size, u the scheme's basis rows.

- ``"copy"`` (Longformer's): row p = source row p mod L. Tokens L apart share a vector, so full attention
  over N tokens sees aliased copies of every position.
- ``"interpolate"`` (LongEmbed-style): row p = the source table linearly interpolated at
  x = p·(L − 1)/(N − 1). No two rows are equal, but every row past 0 moves, so even the first L tokens
  see other vectors than the source gave them.
- ``"hierarchical"`` (Su 2020): row iL + j = α·u_i + (1 − α)·u_j with u = (source − α·source₀)/(1 − α).
  Rows below L equal the source exactly (i = 0), and the copies are told apart by α·u_i. Needs N ≤ L².

Each scheme is a pure function of the table (:func:`extend_table`); :func:`check_scheme` validates a scheme
and its α before any weight is read, and :func:`scheme_record` is what a config records.
"""

from __future__ import annotations

from typing import Any

import torch

#: the schemes, in the order the docs list them; "copy" is today's default
POSITION_SCHEMES = ("copy", "interpolate", "hierarchical")
#: Su's α for the hierarchical decomposition (his blog's value)
DEFAULT_ALPHA = 0.4


def check_scheme(
    scheme: str, alpha: float | None, *, source_rows: int | None = None, rows: int | None = None
):
    """Raise ``ValueError`` for an unknown scheme, an α given to a scheme without one, an α outside (0, 1),
    or (when the lengths are given) an N the scheme cannot reach. Returns the α in use (None unless
    hierarchical)."""
    if scheme not in POSITION_SCHEMES:
        raise ValueError(f"positions must be one of {list(POSITION_SCHEMES)}, got {scheme!r}")
    if scheme != "hierarchical":
        if alpha is not None:
            raise ValueError(f"alpha applies to positions='hierarchical' only, not {scheme!r}")
        return None
    alpha = DEFAULT_ALPHA if alpha is None else alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be a float in (0, 1) (Su's 0.4 by default), got {alpha!r}")
    if source_rows is not None and rows is not None and rows > source_rows**2:
        raise ValueError(
            f"positions='hierarchical' reaches at most L² = {source_rows**2} positions from L = {source_rows},"
            f" not {rows}"
        )
    return float(alpha)


def extend_table(
    table: torch.Tensor, rows: int, *, scheme: str = "copy", alpha: float | None = None
) -> torch.Tensor:
    """The (rows, e) table ``scheme`` makes of ``table`` (L, e), computed in ≥ float32 and returned in
    ``table``'s dtype and device. ``rows`` ≤ L keeps the first ``rows`` rows whatever the scheme."""
    length = table.shape[0]
    alpha = check_scheme(scheme, alpha, source_rows=length, rows=rows)
    if rows <= length:
        return table[:rows].clone()
    work = table.to(torch.promote_types(table.dtype, torch.float32))  # (L, e)
    p = torch.arange(rows, device=table.device)  # (N,)
    if scheme == "copy":
        out = work[p % length]  # (N, e)
    elif scheme == "interpolate":
        x = p.to(work.dtype) * ((length - 1) / (rows - 1))  # (N,) in [0, L − 1]
        lo = x.floor().long().clamp(max=length - 2)  # (N,)
        frac = (x - lo.to(x.dtype))[:, None]  # (N, 1)
        out = torch.lerp(work[lo], work[lo + 1], frac)  # (N, e)
    else:
        u = (work - alpha * work[0]) / (1.0 - alpha)  # (L, e)
        out = alpha * u[p // length] + (1.0 - alpha) * u[p % length]  # (N, e)
    return out.to(table.dtype)


def scheme_record(scheme: str, alpha: float | None, source_rows: int) -> dict[str, Any]:
    """What a config records of an extension: ``{"scheme", "source_length"[, "alpha"]}``."""
    alpha = check_scheme(scheme, alpha)
    record: dict[str, Any] = {"scheme": scheme, "source_length": source_rows}
    if alpha is not None:
        record["alpha"] = alpha
    return record


def check_record(record: Any) -> None:
    """Validate a config's ``position_extension`` (None or what :func:`scheme_record` returns)."""
    if record is None:
        return
    if not isinstance(record, dict) or set(record) - {"scheme", "source_length", "alpha"}:
        raise ValueError(
            "config.position_extension must be None or {'scheme', 'source_length'[, 'alpha']}, got"
            f" {record!r}"
        )
    check_scheme(record.get("scheme"), record.get("alpha"))
    length = record.get("source_length")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"config.position_extension.source_length must be a positive int, got {length!r}")


__all__ = [
    "DEFAULT_ALPHA",
    "POSITION_SCHEMES",
    "check_record",
    "check_scheme",
    "extend_table",
    "scheme_record",
]
