"""The position-schemes experiment's targets, read off a ``long-positions`` report: each long Nyström variant against
``window-512-continued`` at equal tokens, and what the trend of the gap says about a larger budget.

Legend: t tokens seen by a continued run, g(t) = accuracy(variant) − accuracy(window-512-continued) in points.

- **MLM at equal tokens:** overall g ≥ 0 and no bucket below −1 point.
- **Step 0:** the variant's accuracy in the first bucket within 2 points of the source's (on 512-token windows).
- **Trend:** g at every shared evaluation, and a least-squares line g = a + b·log10(t) over the second half
  of them (the first half is dominated by recovering from the conversion). Where b > 0 and g < 0 it gives
  the tokens at which the line reaches 0: an extrapolation of one run whose learning rate decays to zero at
  its end, not a forecast; only a run at that budget tests it.
"""

from __future__ import annotations

import math

from nystrom_lab.long_context.positions import CONTINUED, NYSTROM_ATTENTIONS, SOURCE, split_variant
from nystrom_lab.long_context.positions_screen import SOURCE_WINDOWS

MLM_BUCKET_TOLERANCE = 1.0  # points: no bucket more than this below window-512-continued
STEP0_TOLERANCE = 2.0  # points: the first bucket at step 0 against the source


def long_nystrom(variants: dict) -> list[str]:
    return [
        n for n in variants
        if n not in (SOURCE, CONTINUED) and split_variant(n)[1] in NYSTROM_ATTENTIONS
    ]  # fmt: skip


def _tokens(entry: dict, tokens_per_step: int) -> list[int]:
    """Tokens seen at each evaluation: the curve's own (a packed run's real tokens), else steps × tokens."""
    return entry["curves"].get("tokens") or [step * tokens_per_step for step in entry["curves"]["step"]]


def gap_trend(variant: dict, baseline: dict, tokens_per_step: int) -> dict:
    """g(t) at the variant's evaluations after step 0 that fall within the baseline's curve (the baseline's
    accuracy read off its curve at the same tokens: exact at evaluations both share, linear between), and
    the line over their second half (see the module)."""
    import numpy as np

    bt, bacc = _tokens(baseline, tokens_per_step), baseline["curves"]["mlm_acc"]
    points = [
        (t, 100 * (acc - float(np.interp(t, bt, bacc))))
        for step, t, acc in zip(
            variant["curves"]["step"], _tokens(variant, tokens_per_step), variant["curves"]["mlm_acc"]
        )
        if step > 0 and bt[0] <= t <= bt[-1]
    ]
    out: dict = {"tokens": [t for t, _ in points], "gap_points": [g for _, g in points]}
    tail = points[len(points) // 2 :]
    if len(tail) < 2:
        return out
    xs, ys = [math.log10(t) for t, _ in tail], [g for _, g in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    out.update(fit_points_per_decade=slope, fit_intercept=my - slope * mx)
    if ys[-1] < 0 and slope > 0:
        out["tokens_to_parity"] = 10 ** ((0 - (my - slope * mx)) / slope)
    return out


def targets(report: dict) -> dict:
    """results.json's ``targets``: per long Nyström variant the three checks and the trend."""
    variants, step0 = report["variants"], report["step0"]
    base = variants.get(CONTINUED)
    if not base or not base.get("finished"):
        return {}
    tokens_per_step = report["settings"]["tokens_per_step"]
    source = step0.get(SOURCE_WINDOWS)
    out = {}
    for name in long_nystrom(variants):
        v = variants[name]
        if not v.get("finished"):
            continue
        by_bucket = {
            b: 100 * (v["mlm_acc_by_bucket"][b] - base["mlm_acc_by_bucket"][b])
            for b in v["mlm_acc_by_bucket"]
        }
        gap = 100 * (v["final_mlm_acc"] - base["final_mlm_acc"])
        entry = {
            "tokens_seen": v["tokens_seen"], "gap_points": gap, "gap_points_by_bucket": by_bucket,
            "mlm_met": gap >= 0 and min(by_bucket.values()) >= -MLM_BUCKET_TOLERANCE,
            "trend": gap_trend(v, base, tokens_per_step),
        }  # fmt: skip
        if source and name in step0:
            first = min(source["mlm_acc_by_bucket"], key=lambda b: int(b[1:].split(",")[0]))
            d0 = 100 * (step0[name]["mlm_acc_by_bucket"][first] - source["mlm_acc_by_bucket"][first])
            entry.update(step0_first_bucket_points=d0, step0_met=d0 >= -STEP0_TOLERANCE)
        out[name] = entry
    return out


def targets_table(found: dict) -> str:
    """Markdown: one row per long Nyström variant."""
    if not found:
        return ""
    head = ["variant vs window-512-continued", "tokens", "overall", "worst bucket", "MLM target",
            "step 0 [0, 512) vs source", "gap trend (second half)", "parity by the trend"]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in sorted(found.items(), key=lambda kv: -kv[1]["gap_points"]):
        worst = min(e["gap_points_by_bucket"], key=e["gap_points_by_bucket"].get)
        trend = e["trend"]
        slope = trend.get("fit_points_per_decade")
        parity = trend.get("tokens_to_parity")
        rows.append("| " + " | ".join([
            name, f"{e['tokens_seen'] / 1e6:.2f} M", f"{e['gap_points']:+.2f}",
            f"{e['gap_points_by_bucket'][worst]:+.2f} in {worst}", "met" if e["mlm_met"] else "not met",
            f"{e['step0_first_bucket_points']:+.2f} ({'met' if e['step0_met'] else 'not met'})"
            if "step0_met" in e else "-",
            "-" if slope is None else f"{slope:+.2f} points per 10× tokens",
            "-" if parity is None else f"≈ {parity / 1e6:.1f} M tokens (extrapolated)",
        ]) + " |")  # fmt: skip
    return "\n".join(rows) + "\n"
