"""The packed comparison of ``long-positions`` in words and tables: dev MLM accuracy by position within the
document (:mod:`nystrom_lab.long_context.positions_within`), each variant against ``window-512-continued``,
and what packing changed bucket by bucket.

Legend: P a ``*-packed`` variant, S its stream twin (the same recipe on the stream), W ``window-512-continued``;
a gap is in points of accuracy (100 × the difference of the fractions).

Target (issue item 7, "Long MLM at equal tokens"): a long variant's accuracy overall and in every
within-document bucket ≥ W's, each scored in the layout it trained on.
"""

from __future__ import annotations

import json

from nystrom_lab.long_context.positions import CONTINUED, PACKED, SOURCE, PositionsRun, unpacked

#: buckets of a token's offset from its document's start
BUCKETS = ("[0, 512)", "[512, 1024)", "[1024, 2048)", "≥ 2048")

_KEYS = ("overall", *BUCKETS)


def _accs(entry: dict) -> dict[str, float | None]:
    return {"overall": entry["mlm_acc"], **entry["mlm_acc_by_bucket"]}


def gaps(entry: dict, base: dict) -> dict[str, float | None]:
    """Points of ``entry`` above ``base``, overall and per bucket (None where a bucket holds no masked token)."""
    a, b = _accs(entry), _accs(base)
    return {k: None if a[k] is None or b[k] is None else 100 * (a[k] - b[k]) for k in _KEYS}


def split_entries(entries: dict[str, dict]) -> tuple[dict[str, dict], dict[str, dict]]:
    """``{"variant@layout": entry}`` -> (each variant in the layout it trained on, each in the other one)."""
    own, other = {}, {}
    for e in entries.values():
        (own if e["layout"] == e["trained_layout"] else other)[e["variant"]] = e
    return own, other


def within_summary(entries: dict[str, dict]) -> dict:
    """results.json's ``within_document``: the entries, the gaps to W, the target and the sentences."""
    own, other = split_entries(entries)
    base = own.get(CONTINUED)
    counts = {tuple(e["masked_by_bucket"].items()) for e in entries.values()}
    out: dict = {"buckets": list(BUCKETS), "variants": own, "other_layout": other,
                 "same_masked_tokens": len(counts) <= 1}  # fmt: skip
    if base is not None:
        out["vs_window_512_continued"] = {n: gaps(e, base) for n, e in own.items() if n != CONTINUED}
        out["target"] = {
            n: {"met": all(g >= 0 for g in d.values() if g is not None),  # an empty bucket asks nothing
                "below": [k for k, g in d.items() if g is not None and g < 0]}
            for n, d in out["vs_window_512_continued"].items() if n != SOURCE
        }  # fmt: skip
    out["sentences"] = packing_sentences(own, other)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def within_tables(summary: dict) -> str:
    """Markdown: accuracy by position within the document, the gaps to W, the other layout, the sentences."""
    own = summary.get("variants") or {}
    if not own:
        return ""
    head = ["variant (position within the document)", "trained on", "real tokens", "weights at step",
            "masked", *_KEYS]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in own.items():
        acc = _accs(e)
        rows.append("| " + " | ".join([
            name, f"{e['trained_layout']} {e['length']}", f"{e['real_tokens_seen'] / 1e6:.2f} M",
            str(e.get("weights_step", "-")), str(e["masked"]), *(_pct(acc[k]) for k in _KEYS),
        ]) + " |")  # fmt: skip
    vs = summary.get("vs_window_512_continued") or {}
    if vs:
        head = [f"vs {CONTINUED} (points)", *_KEYS, "target (all ≥ 0)"]
        rows += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, d in vs.items():
            t = summary["target"].get(name)
            verdict = "-" if t is None else ("met" if t["met"] else "not met")
            rows.append("| " + " | ".join([name, *(_pts(d[k]) for k in _KEYS), verdict]) + " |")
    other = summary.get("other_layout") or {}
    if other:
        head = ["scored in the other layout", "scored on", *_KEYS, "vs its own layout (overall)"]
        rows += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, e in other.items():
            acc, mine = _accs(e), own.get(name)
            delta = _pts(gaps(e, mine)["overall"]) if mine else "-"
            rows.append("| " + " | ".join([name, e["layout"], *(_pct(acc[k]) for k in _KEYS), delta]) + " |")
    if not summary.get("same_masked_tokens", True):
        rows += [
            "",
            "**Warning:** the entries were scored on different masked tokens (masked counts differ).",
        ]
    sentences = summary.get("sentences") or []
    return (
        "\n".join(rows) + "\n" + ("\n" + "\n".join(f"* {s}" for s in sentences) + "\n" if sentences else "")
    )


def _by_bucket(d: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {_pts(d[k])}" for k in BUCKETS)


def _moved(d: dict[str, float | None]) -> str:
    """Which buckets rose, fell or stayed (within ±0.05 points)."""
    up = [k for k in BUCKETS if d[k] is not None and d[k] >= 0.05]
    down = [k for k in BUCKETS if d[k] is not None and d[k] <= -0.05]
    flat = [k for k in BUCKETS if d[k] is not None and k not in up and k not in down]
    parts = []
    if up:
        best = max(up, key=lambda k: d[k])
        parts.append(f"up in {len(up)} of {len(BUCKETS)} buckets (most in {best}, {_pts(d[best])})")
    if down:
        worst = min(down, key=lambda k: d[k])
        parts.append(f"down in {', '.join(down)} (most in {worst}, {_pts(d[worst])})")
    if flat:
        parts.append(f"unchanged within 0.05 points in {', '.join(flat)}")
    return "; ".join(parts) if parts else "no bucket holds a masked token"


def packing_sentences(own: dict[str, dict], other: dict[str, dict] | None = None) -> list[str]:
    """What packing changed, in words: each P against S (same recipe, same real tokens), each long variant
    against W (the target), and each model scored in the layout it did not train on."""
    other = other or {}
    out = []
    for p, e in own.items():
        s = unpacked(p)
        if p.endswith(PACKED) and s in own:
            d = gaps(e, own[s])
            out.append(
                f"Packing by documents ({p} against {s}, {e['real_tokens_seen'] / 1e6:.2f} M and"
                f" {own[s]['real_tokens_seen'] / 1e6:.2f} M real tokens): {_pct(e['mlm_acc'])} % against"
                f" {_pct(own[s]['mlm_acc'])} % overall ({_pts(d['overall'])} points); by position within the"
                f" document {_by_bucket(d)}: {_moved(d)}."
            )
    base = own.get(CONTINUED)
    for name, e in own.items():
        if base is None or name in (SOURCE, CONTINUED):
            continue
        d = gaps(e, base)
        below = [k for k, g in d.items() if g is not None and g < 0]
        verdict = "met" if not below else f"not met (below in {', '.join(below)})"
        out.append(
            f"{name} ({e['trained_layout']}) against {CONTINUED}: {_pts(d['overall'])} points overall,"
            f" {_by_bucket(d)}; the target (overall and every bucket ≥ {CONTINUED}) is {verdict}."
        )
    for name, e in other.items():
        if name in own:
            d = gaps(e, own[name])
            out.append(
                f"{name}, trained on {e['trained_layout']} rows, scored on {e['layout']} rows instead:"
                f" {_pts(d['overall'])} points overall, {_by_bucket(d)} (the evaluation's rows alone, same weights)."
            )
    return out


def read_within(run: PositionsRun) -> dict[str, dict]:
    """The finished entries, ``{"variant@layout": entry}``, the source first."""
    folder = run.out / "within"
    paths = sorted(folder.glob("*@*.json")) if folder.is_dir() else []
    found = {p.stem: json.loads(p.read_text()) for p in paths}
    return dict(sorted(found.items(), key=lambda kv: (not kv[0].startswith(SOURCE + "@"), kv[0])))
