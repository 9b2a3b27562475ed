"""Per-parameter learning-rate factors (``TrainConfig.lr_scale``, ``nystrom pretrain --lr-scale``): new
parameters (a fresh MLM head, extended positions, a conv skip) may train faster than a pretrained body."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lab.training.toy_task import config, make_task
from nystrom_lab.argtypes import lr_scale_pair
from nystrom_lab.training import TrainConfig, train
from nystrom_lab.training.loop import _param_groups


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)


def test_groups_split_by_decay_and_factor_first_match_wins():
    net = Net()
    groups = _param_groups(net, 0.01, lr=1e-3, lr_scale=(("head.weight", 10.0), ("head.*", 5.0)))
    got = {(g["weight_decay"], g["lr"]): [id(p) for p in g["params"]] for g in groups}
    assert got == {
        (0.01, 1e-3): [id(net.body.weight)], (0.0, 1e-3): [id(net.body.bias)],
        (0.01, 1e-2): [id(net.head.weight)], (0.0, 5e-3): [id(net.head.bias)],
    }  # fmt: skip
    assert [g["weight_decay"] for g in groups] == [0.01, 0.01, 0.0, 0.0]  # decayed groups first


def test_without_factors_the_groups_are_the_old_two():
    groups = _param_groups(Net(), 0.01, lr=1e-3)
    assert [(g["weight_decay"], g["lr"], len(g["params"])) for g in groups] == [
        (0.01, 1e-3, 2),
        (0.0, 1e-3, 2),
    ]


def test_a_glob_that_matches_nothing_raises():
    with pytest.raises(ValueError, match=r"\['lm_head\*'\] match no trainable parameter name of Net"):
        _param_groups(Net(), 0.0, lr=1e-3, lr_scale=(("lm_head*", 10.0),))


@pytest.mark.parametrize("bad", [(("x", 0.0),), (("", 2.0),), (("x", True),), (("x",),)])
def test_config_validation(bad):
    with pytest.raises(ValueError, match="lr_scale must hold"):
        TrainConfig(steps=1, batch_size=1, lr_scale=bad)


def test_config_round_trip_and_old_configs_load(tmp_path):
    cfg = TrainConfig(steps=3, batch_size=2, lr_scale=(("*head*", 10.0),))
    cfg.save(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == cfg
    old = json.loads(cfg.to_json())
    del old["lr_scale"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert TrainConfig.load(tmp_path / "old.json").lr_scale == ()


def test_training_applies_the_scaled_rate(tmp_path):
    """With the rate of every parameter but one glob's set tiny, only that glob's parameters move."""
    task = make_task(dropout=False)
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    names = [n for n, _ in task.model.named_parameters()]
    last = names[-1]
    train(task, config(steps=4, lr=1e-12, lr_scale=((last, 1e10),)), tmp_path, progress=False)
    after = task.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved == {last}


def test_cli_pair():
    assert lr_scale_pair("*lm_head*=10") == ("*lm_head*", 10.0)
    assert lr_scale_pair("a=b=2.5") == ("a=b", 2.5)
    for bad in ("*lm_head*", "=3", "x=0", "x=nan"):
        with pytest.raises(Exception, match="GLOB=FACTOR|number"):
            lr_scale_pair(bad)


def test_a_pretrain_record_without_the_new_options_resumes_as_their_defaults():
    from nystrom_lab.text.pretrain import same_run

    assert same_run({"steps": 4}, {"steps": 4, "lr_scale": [], "dev_seed": None})
    assert not same_run({"steps": 4}, {"steps": 4, "lr_scale": [["*head*", 10.0]], "dev_seed": None})
    assert not same_run({"steps": 4}, {"steps": 4, "lr_scale": [], "dev_seed": 0})
