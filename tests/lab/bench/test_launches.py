"""The launch counter of ``nystrom bench launches``: what it counts, the modelled fused SDPA, host syncs
on the meta device (every kind a GPU would wait on, planted and found), and the command."""

import json

import pytest
import torch
import torch.nn.functional as F

from nystrom_lab.bench.launches.cases import measure
from nystrom_lab.bench.launches.count import count_call, counting
from nystrom_lab.cli import main


def test_views_metadata_and_allocations_are_not_ops():
    x = torch.randn(4, 6, device="meta")
    with counting() as c:
        y = x.view(2, 12).t().reshape(3, 8)  # views only (reshape of a transposed view copies: clone)
        z = (y + 1).unsqueeze(0).expand(2, 3, 8).sum()  # add, sum
        torch.empty(5, device="meta")
        torch.promote_types(x.dtype, torch.float32)
    assert dict(c.ops) == {"clone": 1, "add": 1, "sum": 1}
    assert dict(c.allocations) == {"empty": 1}
    assert z.shape == ()


def test_sdpa_counts_as_the_fused_kernel_forward_and_backward():
    q = torch.randn(1, 2, 64, 16, device="meta", requires_grad=True)
    k = torch.randn(1, 2, 512, 16, device="meta", requires_grad=True)
    v = torch.randn(1, 2, 512, 16, device="meta")
    mask = torch.ones(1, 1, 1, 512, dtype=torch.bool, device="meta")
    result = count_call(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), backward=True)
    assert result["forward"]["by_op"] == {
        "where (SDPA bool mask -> bias)": 1,
        "_scaled_dot_product_efficient_attention": 1,
    }
    assert result["backward"]["by_op"] == {"_scaled_dot_product_efficient_attention_backward": 1}
    assert result["forward_backward"]["ops"] == 3
    assert k.grad is not None and k.grad.shape == k.shape  # gradients still flow to every input
    assert q.grad.shape == q.shape


def test_a_host_read_on_meta_is_counted_with_its_place_and_does_not_stop_the_count():
    x = torch.randn(8, device="meta")
    with counting() as c:
        if bool(x.sum() > 0):  # a sync on CUDA; on meta the counter answers True
            y = x * 2
    assert c.syncs["_local_scalar_dense"] == 1
    assert any("test_launches.py" in site and "bool(x.sum() > 0)" in site for site in c.sync_sites)
    assert y.shape == (8,)
    assert c.ops["mul"] == 1


_X = torch.randn(8, device="meta")
_MASK = torch.ones(8, dtype=torch.bool, device="meta")

#: each kind of host sync a GPU has, planted: (what the counter names it, the call)
PLANTED = {
    ".item()": ("_local_scalar_dense", lambda: _X.sum().item()),
    "int(t)": ("_local_scalar_dense", lambda: int(_X.argmax())),
    "nonzero": ("nonzero", lambda: torch.nonzero(_X)),
    "boolean-mask index": ("index", lambda: _X[_MASK] * 2),
    "masked_select": ("masked_select", lambda: _X.masked_select(_MASK)),
    "unique": ("_unique2", lambda: torch.unique(_X)),
    "repeat_interleave": (
        "repeat_interleave",
        lambda: torch.repeat_interleave(_X, torch.ones_like(_X).long()),
    ),
    "host tensor to device": ("_to_copy (host <-> device copy)", lambda: torch.ones(3).to("meta")),
    "device tensor to host": ("_to_copy (host <-> device copy)", lambda: _X.cpu()),
    ".tolist()": ("_to_copy (host <-> device copy)", lambda: _X.tolist()),
    "torch.tensor onto the device": (
        "tensor (host data -> device)",
        lambda: torch.tensor([1.0], device="meta"),
    ),
    "host index tensor": ("index (host <-> device copy)", lambda: _X[torch.tensor([1, 2])]),
    "torch.cuda.synchronize": ("cuda.synchronize", lambda: torch.cuda.synchronize()),
    "torch.accelerator.synchronize": ("accelerator.synchronize", lambda: torch.accelerator.synchronize()),
}


@pytest.mark.parametrize("kind", PLANTED)
def test_a_planted_host_sync_is_flagged_with_its_line_and_the_count_goes_on(kind):
    name, call = PLANTED[kind]
    with counting() as c:
        call()
        after = _X * 3  # counting goes on past the sync
    assert dict(c.syncs) == {name: 1}
    assert len(c.sync_sites) == 1 and "test_launches.py" in c.sync_sites[0], c.sync_sites
    assert c.ops["mul"] >= 1 and after.shape == (8,)


def test_what_is_not_a_sync_is_not_flagged():
    with counting() as c:
        y = _X * torch.tensor(2.0)  # a 0-dim host scalar goes to the kernel by value
        y = y.view(2, 4).t().contiguous()
        torch.ones(4, device="meta").add_(1)
    assert sum(c.syncs.values()) == 0 and c.ops["mul"] == 1


def test_a_sync_planted_in_our_masked_module_is_reported(monkeypatch):
    """The masked module's count finds a host read placed on its PyTorch path (and finds none without it)."""
    import nystrom.ops.nystrom.accelerator as accel
    from nystrom.ops.nystrom.fused import fused_kernels

    real = accel.check_finite

    def reads_the_device(name, t):
        if bool(t.isfinite().all()):  # the sync a value check would cost on a GPU
            return real(name, t)
        return None

    with fused_kernels(False):  # the path with value checks (the fused op's kernels hold none)
        assert measure("module-mask", "ours", n=256)["forward"]["host_syncs"] == 0
        monkeypatch.setattr(accel, "check_finite", reads_the_device)
        result = measure("module-mask", "ours", n=256)
    assert result["forward"]["host_syncs"] == 3  # q̃, k̃ and B·V checked
    assert all("test_launches.py" in site for site in result["forward"]["sync_sites"])


def test_the_gpu_count_keeps_the_profilers_own_sync_apart():
    """On CUDA the profiler synchronises when it stops: syncs outside the measured range are its own."""
    from types import SimpleNamespace

    from nystrom_lab.bench.launches.gpu import MEASURED, count_in_range

    def event(name, start, end=None):
        return SimpleNamespace(
            name=name, time_range=SimpleNamespace(start=start, end=start if end is None else end)
        )

    events = [
        event(MEASURED, 10, 50), event("cudaLaunchKernel", 12), event("cudaLaunchKernel", 20),
        event("cudaStreamSynchronize", 30), event("cudaDeviceSynchronize", 60), event("cudaLaunchKernel", 5),
    ]  # fmt: skip
    assert count_in_range(events) == {"launches": 2, "syncs": 1, "profiler_syncs": 1}
    with pytest.raises(RuntimeError, match="one"):
        count_in_range(events[1:])


def test_our_model_has_no_host_sync_on_the_accelerator_path():
    result = measure("model-mask", "ours", n=256)
    for key in ("forward", "forward_backward"):
        assert result[key]["host_syncs"] == 0, result[key]["sync_sites"]
    # a real count: 6 layers of ten ops or more each, and the backward more than the forward
    assert 60 < result["forward"]["ops"] < result["forward_backward"]["ops"]


def test_transformers_nystromformer_reads_its_mask_on_the_host():
    result = measure("model-mask", "hf", n=256)
    assert result["forward"]["host_syncs"] == 1
    assert "masking_utils.py" in result["forward"]["sync_sites"][0]


def test_bench_launches_writes_json_and_markdown(tmp_path, capsys):
    assert main(["bench", "launches", "--lengths", "256", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "launches.json").read_text())
    assert run["n"] == 256
    assert set(run["cases"]) == {"module", "module-mask", "model-mask"}
    ours = run["cases"]["model-mask"]["ours"]["forward"]["ops"]
    hf = run["cases"]["model-mask"]["hf"]["forward"]["ops"]
    printed = capsys.readouterr().out
    assert (
        f"| MiniLM-size model (6 layers), mask of ones | forward | {ours} | {hf} | {ours / hf:.2f}× |"
        in printed
    )
    assert (tmp_path / "launches.md").read_text() in printed


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--device", "cpu"], "meta device"),
        (["--lengths", "256,512"], "one length"),
        (["--heads", "4"], "--heads"),
    ],
)
def test_bench_launches_refuses_options_that_do_not_apply(tmp_path, capsys, extra, says):
    assert main(["bench", "launches", "--out", str(tmp_path), *extra]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "launches.json").exists()


def test_launch_targets_for_the_minilm_size_model_on_the_accelerator_path():
    """Ops per forward ≤ 0.5× transformers' Nystromformer, forward + backward ≤ 0.6×, no host sync
    (a padding mask of ones, 4096 tokens: what the GPU path launches; see docs/gpu/launches.md), on the
    fused op (what CUDA with Triton runs) and on the PyTorch path (CUDA without Triton)."""
    from nystrom.ops.nystrom.fused import fused_kernels

    hf = measure("model-mask", "hf")
    ours = measure("model-mask", "ours")
    with fused_kernels(False):
        pytorch = measure("model-mask", "ours")
    assert (hf["forward"]["ops"], hf["forward_backward"]["ops"]) == (644, 1698)
    # 4 of them build the fused plan's row spans (what packed documents replace), once per forward
    assert (ours["forward"]["ops"], ours["forward_backward"]["ops"]) == (91, 229)
    assert (pytorch["forward"]["ops"], pytorch["forward_backward"]["ops"]) == (170, 944)
    for counts in (ours, pytorch):
        assert counts["forward"]["ops"] <= 0.5 * hf["forward"]["ops"]
        assert counts["forward_backward"]["ops"] <= 0.6 * hf["forward_backward"]["ops"]
        assert counts["forward_backward"]["host_syncs"] == 0
        # what the mask determines is computed once per forward, not per layer (6 layers)
        assert counts["forward"]["by_op"]["cumsum"] == 1
    assert ours["forward"]["by_op"]["fused_attention"] == 6 == pytorch["forward"]["by_op"]["iterative_pinv"]
    assert ours["forward_backward"]["by_op"]["fused_attention_backward"] == 6


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_gpu_check_refuses_without_cuda(tmp_path):
    from nystrom_lab.bench.launches import gpu as launches_gpu

    with pytest.raises(SystemExit, match="CUDA"):
        launches_gpu.main([str(tmp_path)])
    assert not (tmp_path / "launches_gpu.json").exists()


@pytest.mark.gpu
def test_real_launches_of_our_module_on_cuda_have_no_host_sync():
    from nystrom_lab.bench.launches import gpu as launches_gpu

    ours = launches_gpu.measure("module-mask", "ours", n=1024)
    hf = launches_gpu.measure("module-mask", "hf", n=1024)
    assert ours["forward"]["syncs"] == 0 and ours["forward_backward"]["syncs"] == 0
    assert 0 < ours["forward"]["launches"] < hf["forward"]["launches"]


def _minilm_counts_against_bert(n: int, attention: dict | None) -> dict[str, dict]:
    """Ops of our MiniLM-size model (``attention`` spec, None: Nyström) and of transformers' BERT with
    SDPA on meta, bf16, a padding mask of ones: forward and forward + backward."""
    import transformers

    from nystrom.model import NystromformerConfig, NystromformerModel

    size = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    spec = {} if attention is None else {"attention": attention}
    with torch.device("meta"):
        ours = NystromformerModel(
            NystromformerConfig(vocab_size=30522, max_position_embeddings=n, dropout=0.0, hidden_act="gelu",
                                **spec, **size)
        )  # fmt: skip
        bert = transformers.BertModel._from_config(
            transformers.BertConfig(vocab_size=30522, max_position_embeddings=n, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, **size),
            attn_implementation="sdpa",
        )  # fmt: skip
        ids, mask = torch.zeros(1, n, dtype=torch.long), torch.ones(1, n, dtype=torch.long)
    counts = {}
    for name, model in (("ours", ours), ("bert", bert)):
        model = model.eval().to(torch.bfloat16)
        counts[name] = count_call(
            lambda model=model: model(input_ids=ids, attention_mask=mask).last_hidden_state, backward=True
        )
    return counts


def test_our_sdpa_model_dispatches_no_more_ops_than_transformers_bert_with_sdpa():
    """The model's own layers add no launches beside BERT's on the accelerator path: MiniLM size, bf16, a
    padding mask of ones, counted on meta (it was 102 / 258 against BERT's 83 / 243 while the softmax
    module zeroed its q, k and v again after zeroing x)."""
    counts = _minilm_counts_against_bert(256, {"name": "softmax"})
    for key in ("forward", "forward_backward"):
        assert counts["ours"][key]["ops"] <= counts["bert"][key]["ops"], (key, counts["ours"][key]["by_op"])
    assert counts["ours"]["forward_backward"]["host_syncs"] == 0
    assert (counts["ours"]["forward"]["ops"], counts["ours"]["forward_backward"]["ops"]) == (78, 216)


def test_our_nystrom_model_against_transformers_bert_with_sdpa():
    """The fused op's model beside BERT with SDPA on meta (MiniLM size, bf16, 4096 tokens, a padding mask
    of ones): forward + backward no more ops than BERT's; forward 4 more (the x zeroing of each layer,
    which the PyTorch path needs for exact weight gradients; BERT reads its mask on the host instead)."""
    counts = _minilm_counts_against_bert(4096, None)
    ours, bert = counts["ours"], counts["bert"]
    # 4 of them build the fused plan's row spans (what packed documents replace), once per forward
    assert (ours["forward"]["ops"], ours["forward_backward"]["ops"]) == (91, 229)
    assert (bert["forward"]["ops"], bert["forward_backward"]["ops"]) == (83, 243)
    assert ours["forward_backward"]["ops"] <= bert["forward_backward"]["ops"]
    assert ours["forward"]["by_op"]["fused_attention"] == 6 and ours["forward"]["by_op"]["masked_fill"] == 6
    assert ours["forward_backward"]["host_syncs"] == 0 < bert["forward"]["host_syncs"]
