"""Accuracy of "predict the root operator's most frequent label" (fitted on train) on each split."""
import collections
import csv
import sys
from pathlib import Path

csv.field_size_limit(10**8)


def load(f):
    rows = list(csv.reader(open(f), delimiter="\t"))[1:]
    return [(next(t for t in src.split() if t.startswith("[")), int(tgt)) for src, tgt in rows]


root = Path(sys.argv[1])  # the run's data folder
tr, dv, te = (load(root / f"basic_{s}.tsv") for s in ("train", "val", "test"))
counts = collections.defaultdict(collections.Counter)
for op, y in tr:
    counts[op][y] += 1
rule = {op: c.most_common(1)[0][0] for op, c in counts.items()}
print("rule", rule)
for name, ds in (("train", tr), ("dev", dv), ("test", te)):
    print(name, "rule accuracy %.4f" % (sum(rule[o] == y for o, y in ds) / len(ds)))
