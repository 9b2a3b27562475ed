"""`nystrom convert`: the folders it writes work with transformers' Auto classes and pipelines."""

from __future__ import annotations

import torch
import transformers

from nystrom.model import minilm_path
from nystrom_lab.cli import main

transformers.logging.set_verbosity_error()


def test_convert_from_bert_gives_a_pipeline_ready_folder(tmp_path, capsys):
    minilm = minilm_path()
    assert main(["convert", "to-nystrom", "--init-from", "minilm", "--out", str(tmp_path / "nys"), "--attention", "softmax"]) == 0
    text = "Nyström attention approximates softmax attention with landmarks."
    ours = transformers.pipeline("feature-extraction", model=str(tmp_path / "nys"))
    bert = transformers.pipeline("feature-extraction", model=str(minilm))
    a, b = torch.tensor(ours(text)), torch.tensor(bert(text))
    assert a.shape == b.shape and a.shape[-1] == 384
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # softmax attention: BERT's function
    # and back out to transformers' own Nystromformer, tokenizer included
    assert main(["convert", "to-hf", "--init-from", str(tmp_path / "nys"), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModel.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == "NystromformerModel"
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(text)["input_ids"][0] == 101


def test_convert_notes_a_missing_tokenizer(tmp_path, capsys):
    from nystrom.model import NystromformerConfig, NystromformerModel

    cfg = NystromformerConfig.preset("bert-small", vocab_size=40, hidden_size=16, num_attention_heads=2,
                                     intermediate_size=32, num_hidden_layers=1, attention="softmax", pooler=False,
                                     pooling="cls")  # fmt: skip
    NystromformerModel(cfg).save_pretrained(tmp_path / "m")
    assert main(["convert", "to-hf", "--init-from", str(tmp_path / "m"), "--out", str(tmp_path / "hf")]) == 0
    assert "has no tokenizer" in capsys.readouterr().err
    # refused at parse time, before any work
    assert (
        main(
            [
                "convert",
                "to-hf",
                "--init-from",
                str(tmp_path / "m"),
                "--out",
                str(tmp_path / "x"),
                "--tokenizer",
                str(tmp_path / "no.json"),
            ]
        )
        != 0
    )
    assert "no.json" in capsys.readouterr().err and not (tmp_path / "x").exists()
