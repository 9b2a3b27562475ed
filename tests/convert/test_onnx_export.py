"""Export to ONNX (nystrom.convert.export_onnx and `nystrom convert onnx`): each model is traced once at
length 16 (module-scoped fixtures), then ONNX Runtime runs it at other lengths (5 and 33 below and above the
8 landmarks, 70) and batch sizes (1 and 3, rows right-padded; 2, every token real: the graph's unpadded
branch) and must give the eager model's outputs on the real tokens (float32, 1e-5)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

from nystrom.convert import export_onnx, onnx_export, onnx_io  # noqa: E402
from nystrom.convert.onnx_graph import all_graphs  # noqa: E402
from nystrom.model import (  # noqa: E402
    NystromformerConfig,
    NystromformerForDualSequenceClassification,
    NystromformerForMaskedLM,
    NystromformerForMultipleChoice,
    NystromformerForQuestionAnswering,
    NystromformerForSequenceClassification,
    NystromformerForTokenClassification,
    NystromformerModel,
    save_tokenizer,
)
from nystrom_lab.cli import main as cli_main  # noqa: E402

transformers.logging.set_verbosity_error()

NYSTROM = {"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3}
#: the classifier (1 layer): per branch of the If, 3 linear layers and the 2 of the head as Gemms, q/k/v as MatMuls
QUANTIZED_GEMMS, QUANTIZED_MATMULS = 2 * (3 + 2), 2 * 3
SHAPES = [(1, 5), (3, 5), (2, 5), (1, 33), (3, 33), (1, 70), (3, 70), (2, 70)]  # (batch, tokens)


def tiny(layers: int = 1, **overrides) -> NystromformerConfig:
    fields = dict(vocab_size=60, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                  num_hidden_layers=layers, max_position_embeddings=128, attention=NYSTROM)  # fmt: skip
    return NystromformerConfig.preset("bert-small", **{**fields, **overrides})


def feed(b: int, n: int, *, vocab: int, types: bool, choices: int | None = None) -> dict[str, torch.Tensor]:
    """Random inputs, rows right-padded to n, 2n/3, n/3 real tokens (batch 1: n − 2; batch 2: every token
    real)."""
    gen = torch.Generator().manual_seed(b * 1000 + n)
    shape = (b, n) if choices is None else (b, choices, n)
    ids = torch.randint(0, vocab, shape, generator=gen)
    mask = torch.zeros(shape, dtype=torch.long)
    reals = {1: [max(1, n - 2)], 2: [n, n]}.get(b, [n, max(1, 2 * n // 3), max(1, n // 3)])
    for row, real in enumerate(reals):
        mask[row, ..., :real] = 1
    out = {"input_ids": ids, "attention_mask": mask}
    if types:
        out["token_type_ids"] = torch.randint(0, 2, shape, generator=gen)
    return out


def assert_matches(onnx_path, model, shapes=SHAPES, choices: int | None = None) -> None:
    """ONNX Runtime's outputs = the eager model's, on the real tokens (pooled outputs whole)."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    model.eval()
    for b, n in shapes:
        x = feed(b, n, vocab=model.config.vocab_size, types="token_type_ids" in names, choices=choices)
        with torch.no_grad():
            want = model(**x, return_dict=True)
        got = session.run(outputs, {k: v.numpy() for k, v in x.items()})
        for name, value in zip(outputs, got):
            have = onnx_io.real_tokens(torch.from_numpy(value), x["attention_mask"])
            ref = onnx_io.real_tokens(want[name], x["attention_mask"])
            torch.testing.assert_close(
                have, ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} at {(b, n)}: {m}"
            )


def walk(graph) -> list[str]:
    """The operator types of an ONNX graph and of every subgraph in it (If branches, Scan bodies)."""
    import onnx

    return [n.op_type for n in graph.node] + [
        op for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for op in walk(a.g)
    ]


def branches(onnx_path) -> dict[str, list[str]]:
    """The operator types of the graph's If on "every token real": ``then_branch`` (no padding) and
    ``else_branch`` (masked), each with its subgraphs; and ``main`` (the graph around it, without)."""
    import onnx

    graph = onnx.load(str(onnx_path)).graph
    (node,) = [n for n in graph.node if n.op_type == "If"]
    return {"main": [n.op_type for n in graph.node]} | {a.name: walk(a.g) for a in node.attribute}


def all_ops(onnx_path) -> list[str]:
    """The operator types of the graph and of every subgraph in it."""
    import onnx

    return walk(onnx.load(str(onnx_path)).graph)


def io_of(onnx_path) -> tuple[dict[str, list], dict[str, list]]:
    """name -> shape (axis names or sizes) of the inputs and of the outputs."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return ({i.name: i.shape for i in session.get_inputs()}, {o.name: o.shape for o in session.get_outputs()})


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    from nystrom_lab.data.text import train_wordpiece

    folder = tmp_path_factory.mktemp("tok")
    corpus = folder / "c.txt"
    corpus.write_text("the cat sat on the mat\n\nthe dog ran in the park\n" * 5)
    train_wordpiece([corpus], folder / "tokenizer.json", vocab_size=60)  # 44 tokens: below the models' 60
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    torch.manual_seed(0)
    model = NystromformerModel(tiny(layers=2)).eval()  # two layers: the mask plan shared across layers
    return model, export_onnx(model, tmp_path_factory.mktemp("base"), progress=False)


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory, tokenizer_json):
    """An MLM folder with its tokenizer, exported from the folder (loading by config.json's architecture)."""
    torch.manual_seed(1)
    model = NystromformerForMaskedLM(tiny()).eval()
    src, out = tmp_path_factory.mktemp("mlm"), tmp_path_factory.mktemp("mlm-onnx")
    model.save_pretrained(src)
    save_tokenizer(tokenizer_json, src, model_max_length=128)
    return model, src, export_onnx(src, out, progress=False)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    torch.manual_seed(2)
    model = NystromformerForSequenceClassification(tiny(num_labels=3, pooling="mean")).eval()
    return model, export_onnx(model, tmp_path_factory.mktemp("cls"), progress=False)


def test_base_model_equals_eager_at_other_lengths_and_batches(base):
    model, path = base
    inputs, outputs = io_of(path)
    axes = ["batch_size", "sequence_length"]
    assert inputs == {"input_ids": axes, "attention_mask": axes, "token_type_ids": axes}
    assert outputs == {
        "last_hidden_state": ["batch_size", "sequence_length", 32],
        "pooler_output": ["batch_size", 32],
    }
    assert_matches(path, model)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "config.json",
        "model.onnx",
    ]  # no tokenizer given
    # the export's own check: a file that is not the model's function raises
    torch.manual_seed(123)  # not the fixture's seed: other weights
    other = NystromformerModel(tiny(layers=2)).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with pytest.raises(RuntimeError, match="differs from the eager model"):
        onnx_io.verify_with_ort(path, other, names, ["last_hidden_state", "pooler_output"], lengths=[9])


def test_base_model_graph_has_the_operators_onnx_runtime_runs_well(base):
    """The graph ONNX Runtime runs at eager speed: the conv skip is one Conv per layer (not K shifted
    multiply-adds), the masked softmaxes carry no NaN-row Where (3 Softmax per layer: F, A and B), and the
    5 LayerNorms (embeddings, 2 per layer) are written out with a Pow, not ORT's slower LayerNormalization;
    the linear layers on (b, n, e) rows (3 per layer) and the pooler are Gemms with their bias inside, not
    MatMul then Add; each layer's FFN sub-layer runs its rows in blocks (one Scan). All of it twice, in the
    two branches of an If on "every token real and n ≥ m", of which the unpadded one has none of the mask's
    Where (3 per layer: padded hidden states and values, the keys' bias) nor the landmarks' validity (3 per
    layer: F's bias, A's masked scores, A⁺'s identity block)."""
    _, path = base
    graph = branches(path)
    assert "Gemm" not in graph["main"] and graph["main"].count("If") == 1
    for ops in (graph["then_branch"], graph["else_branch"]):
        assert (ops.count("Conv"), ops.count("Softmax"), ops.count("IsNaN")) == (2, 6, 0)
        assert (ops.count("LayerNormalization"), ops.count("Pow")) == (0, 5)
        assert (ops.count("Gemm"), ops.count("Scan")) == (2 * 3 + 1, 2)
    # per layer: 3 Where more in the masked branch for the padding, 3 for the landmarks' validity; each
    # branch keeps the 2 of the landmark assignment (on (b, n) tensors)
    assert (graph["then_branch"].count("Where"), graph["else_branch"].count("Where")) == (4, 16)
    # each branch's Conv reads a weight of its own branch: ORT's NCHWc conv (5x faster) needs that
    import onnx

    (node,) = [n for n in onnx.load(str(path)).graph.node if n.op_type == "If"]
    for branch in (a.g for a in node.attribute):
        local = {t.name for t in branch.initializer}
        assert [c.input[1] in local for c in branch.node if c.op_type == "Conv"] == [True, True]


def unread_initializers(onnx_path) -> list[str]:
    """Initializers of any graph in the file that no node of any graph reads and no graph outputs."""
    import onnx

    graphs = all_graphs(onnx.load(str(onnx_path), load_external_data=False).graph)
    read = {i for g in graphs for n in g.node for i in n.input} | {o.name for g in graphs for o in g.output}
    return [t.name for g in graphs for t in g.initializer if t.name not in read]


def test_onnx_runtime_loads_the_export_without_warnings(base, capfd):
    """Every initializer is read: ONNX Runtime would otherwise drop each unread one with a warning on every
    load (the main graph's conv weights, once the branches hold copies, and constants torch.onnx left)."""
    _, path = base
    assert unread_initializers(path) == []
    capfd.readouterr()
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert "Removing initializer" not in capfd.readouterr().err


def test_export_without_the_unpadded_branch_is_the_masked_graph_alone(tmp_path):
    torch.manual_seed(5)
    model = NystromformerModel(tiny()).eval()
    path = export_onnx(model, tmp_path, unpadded_branch=False, progress=False)
    ops = all_ops(path)
    assert "If" not in ops and ops.count("Softmax") == 3
    assert unread_initializers(path) == []
    assert_matches(path, model)


def test_ffn_rows_in_several_scan_blocks_equal_eager(tmp_path, monkeypatch):
    """The FFN sub-layer's Scan over row blocks with blocks of 7 rows (FFN_BLOCK_BYTES patched): b·n rows
    that 7 does not divide are padded to equal blocks and cut back; every shape of SHAPES runs 1 to 30
    blocks, in both branches."""
    import nystrom.model.layers as layers

    monkeypatch.setattr(layers, "FFN_BLOCK_BYTES", 7 * 64 * 4)  # 7 rows of the (rows, f = 64) float32 activations
    torch.manual_seed(6)
    model = NystromformerModel(tiny()).eval()
    path = export_onnx(model, tmp_path, progress=False)
    assert all_ops(path).count("Scan") == 2
    assert_matches(path, model)


def test_masked_lm_from_a_folder_keeps_its_tokenizer_beside(mlm_folder):
    model, src, path = mlm_folder
    assert io_of(path)[1] == {"logits": ["batch_size", "sequence_length", 60]}
    assert_matches(path, model)
    out = path.parent
    assert json.loads((out / "config.json").read_text())["architectures"] == ["NystromformerForMaskedLM"]
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (
        tok("the cat sat")["input_ids"]
        == transformers.AutoTokenizer.from_pretrained(src)("the cat sat")["input_ids"]
    )


def test_sequence_classification_logits_equal_eager(classifier):
    model, path = classifier
    assert io_of(path)[1] == {"logits": ["batch_size", 3]}
    assert_matches(path, model)


def test_int8_dynamic_quantization_keeps_the_classifier_close(classifier, tmp_path):
    """quantize_onnx: the MatMul weights in int8 (Optimum's file name beside model.onnx); the logits move by
    the quantization's error, not more (random tiny model: within 5 % of the logits' range)."""
    from nystrom.convert import quantize_onnx

    model, path = classifier
    q = quantize_onnx(path.parent, out_path=tmp_path / "model_quantized.onnx")
    ops, float_ops = all_ops(q), all_ops(path)  # the If's branches quantized too
    # every linear layer is quantized, the Gemms (out, FFN, pooler/classifier: written as MatMul first) too
    assert "Gemm" not in ops and float_ops.count("Gemm") == QUANTIZED_GEMMS
    assert ops.count("MatMulInteger") == QUANTIZED_GEMMS + QUANTIZED_MATMULS
    session = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    x = feed(3, 33, vocab=60, types=True)
    with torch.no_grad():
        want = model(**x).logits
    got = torch.from_numpy(session.run(["logits"], {k: v.numpy() for k, v in x.items()})[0])
    assert (got - want).abs().max() <= 0.05 * (want.max() - want.min())
    with pytest.raises(FileNotFoundError, match="no model.onnx there"):
        quantize_onnx(tmp_path / "nothing")
    with pytest.raises(ValueError, match="is the model itself"):
        quantize_onnx(path, out_path=path)


def test_cli_exports_a_token_classifier_folder(tmp_path, capsys, tokenizer_json):
    torch.manual_seed(3)
    model = NystromformerForTokenClassification(tiny(num_labels=4, type_vocab_size=0)).eval()
    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tokenizer_json, tmp_path / "m", model_max_length=128)
    out = tmp_path / "onnx"
    assert cli_main(["convert", "onnx", "--init-from", str(tmp_path / "m"), "--out", str(out), "--opset", "18",
                     "--quantize"]) == 0  # fmt: skip
    printed = capsys.readouterr()
    assert f"wrote {out / 'model.onnx'}" in printed.out and "opset 18" in printed.out
    assert "logits (batch_size, sequence_length, 4)" in printed.out and "tokenizer.json" in printed.out
    assert "ONNX Runtime = eager" in printed.err  # the export's own check ran
    assert f"wrote {out / 'model_quantized.onnx'}" in printed.out and (out / "model_quantized.onnx").is_file()
    inputs, outputs = io_of(out / "model.onnx")
    assert list(inputs) == ["input_ids", "attention_mask"]  # no token types in this model
    assert_matches(out / "model.onnx", model)
    # a task whose head the folder has no weights for is refused, before any export
    assert cli_main(["convert", "onnx", "--init-from", str(tmp_path / "m"), "--out", str(tmp_path / "x"),
                     "--task", "question-answering"]) == 1  # fmt: skip
    assert "no weights for" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_bert_with_nystrom_attention_equals_eager(tmp_path):
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    cfg.nystrom_attention = {"num_landmarks": 8}
    torch.manual_seed(4)
    model = transformers.BertModel._from_config(cfg, attn_implementation="nystrom").eval()
    path = export_onnx(model, tmp_path, progress=False)
    assert set(io_of(path)[1]) == {"last_hidden_state", "pooler_output"}
    assert "If" not in all_ops(path)  # transformers' forward does not trace inside torch.cond: no branch
    assert_matches(path, model)
    with pytest.raises(RuntimeError, match="could not trace BertModel.*unpadded_branch=False"):
        export_onnx(model, tmp_path / "branch", unpadded_branch=True, progress=False)
    # were transformers' forward to trace under torch.cond one day, its unpadded branch would still check
    # every landmark: its m lives in the config, not in modules the export can read
    from nystrom.convert.onnx_graph import ExportedForward

    forward = ExportedForward(model, ["last_hidden_state"], unpadded_branch=True)
    assert (forward.landmarks_known, forward.min_length) == (False, 1)
    ours = ExportedForward(NystromformerModel(tiny(layers=2)), ["last_hidden_state"], unpadded_branch=True)
    assert (ours.landmarks_known, ours.min_length) == (True, 8)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [NystromformerForQuestionAnswering, NystromformerForMultipleChoice])
def test_question_answering_and_multiple_choice_equal_eager(tmp_path, cls):
    model = cls(tiny(pooling="mean")).eval()
    path = export_onnx(model, tmp_path, progress=False)
    choices = 3 if cls is NystromformerForMultipleChoice else None
    assert_matches(path, model, shapes=[(1, 5), (3, 33)], choices=choices)
    if choices:
        assert io_of(path)[0]["input_ids"] == ["batch_size", "num_choices", "sequence_length"]


def test_attention_that_does_not_trace_is_refused_with_the_reason(tmp_path):
    model = NystromformerModel(tiny(attention=[NYSTROM, {"name": "reformer"}], layers=2))
    with pytest.raises(ValueError, match="layer 1 .* 'reformer', which does not export"):
        export_onnx(model, tmp_path, progress=False)
    assert not (tmp_path / "model.onnx").exists()


def test_long_model_with_windows_below_and_nystrom_above_equals_eager(tmp_path):
    """The long models' layout (nystrom convert long): a Longformer window below, Nyström above. Window 41 has
    blocks of 20 tokens; the example holds two (21 tokens) and every length runs afterwards, one block (5)
    or many (70), with padding."""
    torch.manual_seed(3)
    window = {"name": "longformer", "window_size": 41}
    model = NystromformerModel(tiny(attention=[window, NYSTROM], layers=2)).eval()
    assert onnx_export.example_length_for(model) == 21
    with pytest.raises(ValueError, match="example_length 16 is below 21: the example must hold two blocks"):
        export_onnx(model, tmp_path, example_length=16, progress=False)
    path = export_onnx(model, tmp_path, progress=False)
    assert_matches(path, model)


def test_what_cannot_be_exported_says_so(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="two documents"):
        export_onnx(NystromformerForDualSequenceClassification(tiny()), tmp_path, progress=False)
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64))  # fmt: skip
    bert.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='nystrom'"):
        export_onnx(bert, tmp_path, progress=False)
    with pytest.raises(ValueError, match="example_length"):
        export_onnx(NystromformerModel(tiny()), tmp_path, example_length=3, progress=False)
    NystromformerModel(tiny()).save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="the model's own folder"):
        export_onnx(tmp_path / "m", tmp_path / "m", progress=False)
    with pytest.raises(ValueError, match="a model is exported as it is"):
        export_onnx(NystromformerModel(tiny()), tmp_path, task="fill-mask", progress=False)
    real = onnx_io.importlib.util.find_spec
    monkeypatch.setattr(
        onnx_io.importlib.util, "find_spec", lambda n, *a: None if n == "onnxscript" else real(n, *a)
    )
    with pytest.raises(ImportError, match=r"onnxscript.*pip install onnx onnxscript onnxruntime"):
        export_onnx(NystromformerModel(tiny()), tmp_path, progress=False)


def test_cli_lists_match_the_library_and_help_loads_no_torch():
    from nystrom_lab.text import convert_onnx

    assert convert_onnx.TASKS == tuple(onnx_io.TASKS)
    assert convert_onnx.ATTN_IMPLEMENTATIONS == onnx_export.TRACEABLE_ATTN
    code = ("import sys; from nystrom_lab.cli import main\ntry: main(['convert', 'onnx', '--help'])\n"
            "except SystemExit: pass\nprint([m for m in ('torch', 'nystrom', 'onnx') if m in sys.modules])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr
