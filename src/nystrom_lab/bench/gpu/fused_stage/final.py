"""The fused stage's last step: whole calls with the sweep's choices, and ``fused_tuning.json``'s content
(its format is in :mod:`.sweep`'s docstring)."""

from __future__ import annotations

import torch

from nystrom_lab.bench.gpu.fused_stage.common import Clock, Setting, attention, fused, timed_ms
from nystrom_lab.bench.gpu.fused_stage.sweep import MIN_GAIN, MODES, data


def concurrent(chosen: dict) -> dict:
    """``chosen`` with ``landmark_pinv`` on a side stream beside the key pass (``CONCURRENT``)."""
    return {**chosen, "landmark_pinv": {**chosen.get("landmark_pinv", {}), "CONCURRENT": 1}}


def check(s: Setting, chosen: dict, clock: Clock) -> dict:
    """Whole calls (forward in inference, forward + backward) with the launchers' defaults, with
    ``tuned(chosen)`` and with the chosen pinv beside the key pass (:func:`concurrent`, an effect only a
    whole call shows): CUDA events, median of ``reps``. ``"concurrent"`` says whether the last won by
    :data:`MIN_GAIN` in every mode and length."""
    from nystrom.ops.nystrom.fused.launch import tuned

    res: dict = {mode: {} for mode in MODES}
    for n in s.lengths:
        if clock.left() < 2:
            res["skipped"] = "over the stage's time budget"
            break
        d = data(s, n)
        for mode in MODES:

            def call(mode=mode):
                with fused(True):
                    if mode == "fwd":
                        with torch.no_grad():
                            return attention(d.q, d.k, d.v, d.w, s.landmarks)
                    return torch.autograd.grad(attention(d.q, d.k, d.v, d.w, s.landmarks), d.proj, d.grad)

            row = {}
            for name, overrides in (("default", {}), ("chosen", chosen), ("concurrent", concurrent(chosen))):
                with tuned(overrides):
                    row[f"{name}_ms"] = round(timed_ms(call, s.device, s.reps, warmup=1 if s.dry else 2), 4)
            res[mode][str(n)] = row
    rows = [row for mode in MODES for row in res[mode].values()]
    on_gpu = torch.device(s.device).type == "cuda" and not s.dry  # off CUDA the side stream is the same one
    res["concurrent"] = on_gpu and bool(rows) and all(
        r["concurrent_ms"] <= (1 - MIN_GAIN) * r["chosen_ms"] for r in rows
    )
    return res


def tuning(s: Setting, result: dict, final: dict, env: dict) -> dict:
    """``fused_tuning.json``'s content (see the module's doc)."""
    units = [u for u in result["units"] if "chosen" in u]
    return {"format": 1, "what": "launch choices of nystrom.ops.nystrom.fused from scripts/gpu_bench.sh's "
                                 "sweep; 'chosen' is a mapping for launch.tuned()",
            **{k: env.get(k) for k in ("gpu", "capability", "torch", "triton", "cuda")},
            "setting": s.describe(),
            "chosen": (concurrent if final.get("concurrent") else dict)({u["kernel"]: u["chosen"] for u in units}),
            "defaults": {u["kernel"]: u["default"] for u in units},
            "speedup": {u["kernel"]: u["speedup"] for u in units},
            "kernel_us": {u["kernel"]: {n: {"default": u["default_us"][n], "chosen": u["chosen_us"][n]}
                                        for n in u["default_us"]} for u in units},
            "check": final}  # fmt: skip
