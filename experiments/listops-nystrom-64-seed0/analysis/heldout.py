import csv, json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from nystrom_lab.lra.experiment import LRARun, make_task
from nystrom_lab.data.lra.collate import collate_single
from nystrom_lab.data.lra.loaders import load_listops
csv.field_size_limit(10**8)
out = Path("experiments/listops-nystrom-64-seed0")
run = LRARun(task="listops", attention="nystrom-64", seed=0, eval_every=250, bf16=True, out=out)
task = make_task(run, out)
task.model.load_state_dict(load_file(str(out/"best.safetensors"))); task.model.eval()
ds = load_listops(Path(sys.argv[1]), split="test", max_length=2000)
train_src = set(r[0] for r in list(csv.reader(open(out/"data/basic_train.tsv"), delimiter="\t"))[1:])
rows = list(csv.reader(open(Path(sys.argv[1]) / "basic_test.tsv"), delimiter="\t"))[1:]
overlap = sum(r[0] in train_src for r in rows)
rule = {'[MED': 4, '[MAX': 9, '[MIN': 0, '[SM': 2}
ops = [next(t for t in r[0].split() if t.startswith("[")) for r in rows]
order = sorted(range(len(ds)), key=lambda i: ds.lengths[i])
correct = 0; rule_ok = 0; agree = 0
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    for s in range(0, len(order), 64):
        idx = order[s:s+64]
        batch = collate_single([ds[i] for i in idx], padded=True, trim=True)
        pred = task.model(**batch).logits.argmax(-1).tolist()
        for i, p, y in zip(idx, pred, batch["labels"].tolist()):
            correct += p == y; rule_ok += rule[ops[i]] == y; agree += p == rule[ops[i]]
n = len(order)
res = {"examples": n, "overlap_with_train": overlap, "model_acc": correct/n, "rule_acc": rule_ok/n, "model_agrees_with_rule": agree/n}
print(res); Path(sys.argv[2]).write_text(json.dumps(res))
