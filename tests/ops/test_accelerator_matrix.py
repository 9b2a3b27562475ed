"""The accelerator path against the CPU path, cell by cell: dtype × mode × mask × model.

The accelerator path is what CUDA runs: Nyström attention through the fused Triton kernels
(``nystrom.ops.nystrom.fused``), or with them off through PyTorch ops (the ``nystrom::iterative_pinv`` op,
SDPA), and the model's other layers as few large ops. On a machine without a GPU both run on CPU tensors
inside ``force_accelerator_path()``, the fused kernels by Triton's interpreter; with the ``gpu`` marker the
same test functions run them on CUDA. Each cell compares it with the CPU path (the cache-blocked kernels,
run on the CPU in the same dtype) within that dtype's tolerance.

Axes:
* dtype: fp32, bf16, fp16 (weights and inputs cast), and bf16 autocast over fp32 weights;
* mode: inference; a training step (loss, ``backward()``, AdamW); under autocast the step twice, with
  ``backward()`` inside and outside the autocast block;
* mask: none, and right padding (one sample shorter than the rest, n not a multiple of m);
* model: the attention module, our whole model with its MLM head, and transformers' BERT with its MLM
  head and ``attn_implementation="nystrom"``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

from nystrom import NystromAttention
from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
from nystrom.ops.nystrom.fused import LAUNCHES, fused_kernels
from nystrom.utils.device import force_accelerator_path

from oracle import rel_err, right_pad_mask

N, M, VOCAB = 30, 8, 50  # n not a multiple of m
LENGTHS = [N, 19]  # the padded batch: the second sample is right-padded

#: dtype cell -> (weights and inputs dtype, autocast dtype or None)
DTYPES = {
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "fp16": (torch.float16, None),
    "autocast-bf16": (torch.float32, torch.bfloat16),
}
#: relative error allowed between the two paths, outputs/losses and gradients (two roundings of each op)
TOLERANCE = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 4e-3, "autocast-bf16": 3e-2}
GRAD_TOLERANCE = {"fp32": 1e-4, "bf16": 8e-2, "fp16": 1e-2, "autocast-bf16": 8e-2}
MODELS = ("module", "nystromformer", "bert")

DEVICES = [
    pytest.param("cpu", "accelerator", id="cpu-forced"),
    pytest.param("cpu", "fused", id="cpu-fused-interpreted", marks=pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton, Linux)")),
    pytest.param("cuda", "fused", id="cuda", marks=pytest.mark.gpu),
    pytest.param("cuda", "accelerator", id="cuda-pytorch-path", marks=pytest.mark.gpu),
]  # fmt: skip


def _modes(dtype: str) -> list[str]:
    extra = ["train-backward-outside-autocast"] if DTYPES[dtype][1] is not None else []
    return ["inference", "train", *extra]


CELLS = [
    pytest.param(dtype, mode, masked, model, id=f"{model}-{dtype}-{mode}-{'padded' if masked else 'nomask'}")
    for model in MODELS
    for dtype in DTYPES
    for mode in _modes(dtype)
    for masked in (False, True)
]

#: Triton's interpreter takes 0.2 s a kernel launch (up to 6 s a cell on 2 CPU cores). The default suite runs
#: the fused kernels interpreted in every cell of the module and, in our model and BERT, in this sample,
#: which still gives each model every dtype, mode and mask; their other interpreted cells are marked slow
#: (the whole table: bash scripts/test.sh -m "slow or not slow" tests/ops/test_accelerator_matrix.py).
INTERPRETED_MODEL_SAMPLE = (
    "fp32-train-padded",
    "bf16-inference-padded",
    "fp16-train-nomask",
    "autocast-bf16-train-padded",
    "autocast-bf16-train-backward-outside-autocast-nomask",
)


def _interpreted_and_left_out(cell, device) -> bool:
    model = cell.values[3]
    return (
        device.id == "cpu-fused-interpreted"
        and model != "module"
        and cell.id.removeprefix(f"{model}-") not in INTERPRETED_MODEL_SAMPLE
    )


MATRIX = [
    pytest.param(*cell.values, *device.values, id=f"{cell.id}-{device.id}", marks=[
        *cell.marks, *device.marks, *([pytest.mark.slow] if _interpreted_and_left_out(cell, device) else [])])
    for cell in CELLS
    for device in DEVICES
]  # fmt: skip


@dataclass
class Case:
    """One model and its batch: ``forward()`` gives the output compared at real tokens, ``loss()`` the
    scalar trained on."""

    model: torch.nn.Module
    forward: Callable[[torch.nn.Module], torch.Tensor]
    loss: Callable[[torch.nn.Module], torch.Tensor]
    real: torch.Tensor  # (b, n) bool: the positions compared


def _nystromformer(layers: int) -> torch.nn.Module:
    cfg = NystromformerConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, dropout=0.0,
        attention={"name": "nystrom", "num_landmarks": M, "conv_kernel_size": 3},
    )  # fmt: skip
    return NystromformerForMaskedLM(cfg)


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    cfg.nystrom_attention = {"num_landmarks": M}
    return BertForMaskedLM._from_config(cfg, attn_implementation="nystrom")


def make_case(model: str, masked: bool, dtype: torch.dtype, device: str, *, layers: int = 2) -> Case:
    """A seeded model in ``dtype`` on ``device`` and its batch of 2 (padded or not); ``layers`` for ours."""
    torch.manual_seed(0)
    real = right_pad_mask(LENGTHS, N) if masked else torch.ones(2, N, dtype=torch.bool)
    mask = real.to(device) if masked else None
    if model == "module":
        mod = NystromAttention(32, heads=2, dim_head=16, num_landmarks=M, conv_kernel_size=3)
        x = torch.randn(2, N, 32).to(device, dtype)
        target = torch.randn(2, N, 32).to(device)
        keep = real.to(device)[..., None]

        def forward(mod: torch.nn.Module) -> torch.Tensor:
            return mod(x, mask=mask)

        def loss(mod: torch.nn.Module) -> torch.Tensor:
            return ((forward(mod).float() - target) * keep).square().mean()

        return Case(mod.to(device, dtype), forward, loss, real)
    mod = _nystromformer(layers) if model == "nystromformer" else _bert()
    mod = mod.eval()  # no dropout: both paths must compute one function
    ids = torch.randint(1, VOCAB, (2, N)).to(device)
    labels = ids.masked_fill(~real.to(device), -100)
    attention_mask = None if mask is None else mask.long()

    def forward(mod: torch.nn.Module) -> torch.Tensor:
        return mod(input_ids=ids, attention_mask=attention_mask).logits

    def loss(mod: torch.nn.Module) -> torch.Tensor:
        return mod(input_ids=ids, attention_mask=attention_mask, labels=labels).loss

    return Case(mod.to(device, dtype), forward, loss, real)


@contextlib.contextmanager
def accelerator(device: str, path: str = "accelerator") -> Iterator[None]:
    """The accelerator path on ``device``: forced on CPU tensors, the device's own path elsewhere; ``path``
    ``"fused"``: Nyström attention through the fused Triton kernels (run by Triton's interpreter on CPU
    tensors), ``"accelerator"``: with them off (its PyTorch ops)."""
    forced = force_accelerator_path() if device == "cpu" else contextlib.nullcontext()
    with forced, fused_kernels(path == "fused"):
        yield


def autocast(device: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast(device, dtype) if dtype is not None else contextlib.nullcontext()


def run_cell(case: Case, mode: str, device: str, amp: torch.dtype | None) -> dict:
    """The cell's results on ``device``: the output (inference) or two AdamW steps' losses and the first
    step's gradients (training), all on the CPU in float64."""
    model = case.model
    if mode == "inference":
        with torch.no_grad(), autocast(device, amp):
            out = case.forward(model)
        assert out.dtype == (amp or next(model.parameters()).dtype)
        return {"out": out.double().cpu()[case.real.expand(out.shape[:2])]}
    # AdamW's default eps (1e-8) is 0 in float16, and so is many a squared gradient: 0/0 on the first step
    eps = 1e-4 if next(model.parameters()).dtype == torch.float16 else 1e-8
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=eps)
    losses, grads = [], None
    for _ in range(2):
        with autocast(device, amp):
            loss = case.loss(model)
            if mode == "train":
                loss.backward()
        if mode == "train-backward-outside-autocast":
            loss.backward()
        if grads is None:
            grads = {n: p.grad.double().cpu() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().double().cpu())
    for p in model.parameters():
        assert bool(p.isfinite().all())
    return {"losses": torch.stack(losses), "grads": grads}


def compare(got: dict, want: dict, dtype: str) -> None:
    if "out" in want:
        assert rel_err(got["out"], want["out"]) <= TOLERANCE[dtype]
        return
    assert rel_err(got["losses"], want["losses"]) <= TOLERANCE[dtype]
    assert got["grads"].keys() == want["grads"].keys() and len(want["grads"]) >= 4
    for name, g in want["grads"].items():
        scale = max(g.norm().item(), 1e-3 * max(w.norm().item() for w in want["grads"].values()))
        assert (got["grads"][name] - g).norm().item() <= GRAD_TOLERANCE[dtype] * scale, name


@pytest.mark.parametrize(("dtype", "mode", "masked", "model", "device", "path"), MATRIX)
def test_accelerator_path_agrees_with_the_cpu_path(dtype, mode, masked, model, device, path):
    weights, amp = DTYPES[dtype]
    want = run_cell(make_case(model, masked, weights, "cpu"), mode, "cpu", amp)
    before = LAUNCHES.copy()
    with accelerator(device, path):
        got = run_cell(make_case(model, masked, weights, device), mode, device, amp)
    # every layer of every forward ran the kernels (none fell back to the PyTorch path), or none did
    layers = 1 if model == "module" else 2
    forwards = 1 if mode == "inference" else 2  # two training steps
    fused = path == "fused"
    ran = {name: LAUNCHES[name] - before[name] for name in ("query_pass", "query_backward")}
    assert ran == {"query_pass": layers * forwards * fused,
                   "query_backward": layers * forwards * fused * (mode != "inference")}  # fmt: skip
    compare(got, want, dtype)


def test_the_matrix_covers_every_axis():
    """Every axis value (dtype, mode, mask, model) appears, and no cell is skipped by construction."""
    ids = {p.id for p in CELLS}
    assert len(ids) == len(CELLS) == len(MODELS) * 2 * sum(len(_modes(d)) for d in DTYPES) == 54
    for word in ("fp32", "bf16", "fp16", "autocast-bf16", "inference", "train", "backward-outside",
                 "nomask", "padded", "module", "nystromformer", "bert"):  # fmt: skip
        assert any(word in i for i in ids), word
    assert len(MATRIX) == len(CELLS) * len(DEVICES)
    for model in MODELS:  # the interpreted cells of the default suite: every dtype, mode and mask
        cells = [p.values for p in MATRIX if p.values[3] == model and p.id.endswith("-cpu-fused-interpreted")
                 and not any(mark.name == "slow" for mark in p.marks)]  # fmt: skip
        assert {c[0] for c in cells} == set(DTYPES), model
        assert {c[1] for c in cells} == {"inference", "train", "train-backward-outside-autocast"}, model
        assert {c[2] for c in cells} == {False, True}, model
        assert len(cells) == (18 if model == "module" else len(INTERPRETED_MODEL_SAMPLE)), model


def test_a_copy_of_a_case_computes_the_same_output():
    """The two paths start from identical weights and batches: make_case is deterministic."""
    a, b = (
        make_case("nystromformer", True, torch.float32, "cpu"),
        make_case("nystromformer", True, torch.float32, "cpu"),
    )
    with torch.no_grad():
        assert torch.equal(a.forward(a.model), b.forward(copy.deepcopy(b.model)))


# torch.compile on the accelerator path ------------------------------------------------------------------

#: on the CPU every cell of the PyTorch path and the fp32 training step through the fused op (Triton's
#: interpreter); on CUDA the autocast cells only, both paths (what GPU users compile; each compile of forward
#: and backward costs tens of seconds, and the GPU script's test stage has a budget)
#: The training step first: the inference cell after it finds most of its kernels in inductor's on-disk cache
#: (which pytest-xdist's workers share): 9–14 s instead of 28 s on 2 CPU cores.
COMPILE_CELLS = [
    pytest.param(dtype, mode, device, path, id=f"{dtype}-{mode}-{device_id}", marks=marks)
    for device, path, device_id, marks, dtypes, modes in (
        ("cpu", "accelerator", "cpu-forced", (), ("fp32", "autocast-bf16"), ("train", "inference")),
        ("cpu", "fused", "cpu-fused-interpreted", (), ("fp32",), ("train",)),
        ("cuda", "fused", "cuda", (pytest.mark.gpu,), ("autocast-bf16",), ("train", "inference")),
        ("cuda", "accelerator", "cuda-pytorch-path", (pytest.mark.gpu,), ("autocast-bf16",), ("train", "inference")),
    )
    for dtype in dtypes
    for mode in modes
]  # fmt: skip


def _compile_case(dtype: str, device: str) -> Case:
    """The smallest model that showed the faults: our model with its MLM head, 1 layer, padded batch."""
    return make_case("nystromformer", True, DTYPES[dtype][0], device, layers=1)


@pytest.mark.parametrize(("dtype", "mode", "device", "path"), COMPILE_CELLS)
def test_compiled_model_agrees_with_eager_on_the_accelerator_path(dtype, mode, device, path):
    """``torch.compile(model)`` (inductor, default mode): the inference forward, and a training step
    whose ``backward()`` runs inside the autocast block, give eager's outputs, losses and gradients."""
    import torch._dynamo

    torch._dynamo.reset()
    amp = DTYPES[dtype][1]
    with accelerator(device, path):
        want = run_cell(_compile_case(dtype, device), mode, device, amp)
        case = _compile_case(dtype, device)
        compiled = torch.compile(case.model)
        got = run_cell(Case(compiled, case.forward, case.loss, case.real), mode, device, amp)
    if "grads" in got:  # the compiled module's parameters are the model's, under an _orig_mod. prefix
        got["grads"] = {name.removeprefix("_orig_mod."): g for name, g in got["grads"].items()}
    compare(got, want, dtype)
