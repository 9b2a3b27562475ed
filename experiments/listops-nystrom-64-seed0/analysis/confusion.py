import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from nystrom_lab.lra.experiment import LRARun, make_task
from nystrom_lab.data.lra.collate import collate_single
out = Path("experiments/listops-nystrom-64-seed0")
run = LRARun(task="listops", attention="nystrom-64", seed=0, eval_every=250, bf16=True, out=out)
task = make_task(run, out)
res = {}
for tag, path in [("best", out/"best.safetensors"), ("last", out/"last/model.safetensors")]:
    sd = load_file(str(path)); task.model.load_state_dict(sd); task.model.eval()
    for split in ("dev", "test"):
        ds = getattr(task, split); order = sorted(range(len(ds)), key=lambda i: ds.lengths[i]) if hasattr(ds, "lengths") else range(len(ds))
        order = list(order); conf = torch.zeros(10, 10, dtype=torch.long)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for s in range(0, len(order), 64):
                batch = collate_single([ds[i] for i in order[s:s+64]], padded=True, trim=True)
                logits = task.model(**batch).logits
                for t, p in zip(batch["labels"].tolist(), logits.argmax(-1).tolist()): conf[t, p] += 1
        acc = conf.diag().sum().item() / conf.sum().item()
        res[f"{tag}-{split}"] = {"acc": acc, "per_class_recall": (conf.diag() / conf.sum(1).clamp(min=1)).round(decimals=3).tolist(), "pred_share": (conf.sum(0) / conf.sum()).round(decimals=3).tolist()}
        print(tag, split, acc, res[f"{tag}-{split}"], flush=True)
Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
