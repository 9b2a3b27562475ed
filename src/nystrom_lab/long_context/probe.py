"""Training-step time and peak memory of a long-context variant (:func:`probe`), measured in a fresh
interpreter (:func:`probe_in_child`) so that the peak is the variant's alone; used by the reports of
``nystrom pretrain long-context`` and ``long-positions``.

Legend: b batch, n tokens (the variant's length).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time

from nystrom_lab.long_context.run import LongRun


def probe(
    run: LongRun, variant: str, *, steps: int = 3, recompute: bool = False, device: str = "auto"
) -> dict:
    """Training-step time and peak memory of ``variant`` at its batch, in this (fresh) process: random
    tokens, 15 % of positions predicted, AdamW, under the run's precision, on ``device`` (``auto``: CUDA when
    there is one; the peak is then CUDA's allocated memory, else the process's resident set). ``recompute``
    switches every attention layer (each of a per-layer list) to ``recompute=True`` (q/k/v rebuilt in the
    backward; Nyström and softmax only)."""
    import torch

    from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
    from nystrom_lab.text.mlm import MaskedLMObjective
    from nystrom_lab.training.device import autocast, resolve_device, to_device

    dev = resolve_device(device)
    torch.manual_seed(0)
    config = NystromformerConfig.from_pretrained(run.model_dir(variant))
    specs = config.attention
    config.attention = (
        [_with_recompute(s, recompute) for s in specs]
        if isinstance(specs, list)
        else _with_recompute(specs, recompute)
    )
    model = NystromformerForMaskedLM.from_pretrained(run.model_dir(variant), config=config).train().to(dev)
    length = run.length(variant)
    b = run.tokens_per_step // length
    obj = MaskedLMObjective(model, edges=(0, length))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(1000, model.config.vocab_size, (b, length))
    labels = torch.where(torch.rand(b, length) < 0.15, ids, -100)
    batch = to_device({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
                       "positions": torch.arange(length).expand(b, length)}, dev)  # fmt: skip
    cuda = dev.type == "cuda"
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        with autocast(dev, run.precision):
            loss = obj(**batch)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(dev)  # the step's kernels finish before its time is read
        times.append(time.perf_counter() - t)
    if cuda:
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"step_s": times, "median_step_s": statistics.median(times[1:] or times), "peak_mem_mb": peak,
            "memory": "cuda allocated" if cuda else "resident set", "device": str(dev),
            "batch_size": b, "length": length, "recompute": recompute}  # fmt: skip


def _with_recompute(spec: dict, recompute: bool) -> dict:
    """``spec`` with ``recompute`` set where its attention offers the option (a local window has none)."""
    import inspect

    from nystrom.attention import REGISTRY

    offered = "recompute" in inspect.signature(REGISTRY[spec["name"]].__init__).parameters
    return {**spec, "recompute": recompute} if offered else spec


def probe_in_child(run: LongRun, variant: str, *, recompute: bool = False) -> dict:
    """:func:`probe` of ``variant`` of ``run`` (rebuilt from its record) in a new interpreter, so that its peak
    memory is the variant's alone; a failure raises with the child's traceback."""
    module, cls = type(run).__module__, type(run).__qualname__
    code = (
        f"import json, sys; from {module} import {cls};"
        "from nystrom_lab.long_context.probe import probe;"
        f"print(json.dumps(probe({cls}.from_record(json.loads(sys.argv[1])), sys.argv[2],"
        " recompute=sys.argv[3] == '1')))"
    )
    done = subprocess.run([sys.executable, "-c", code, json.dumps(run.record()), variant, "1" if recompute else "0"],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the probe of {variant} failed:\n{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
