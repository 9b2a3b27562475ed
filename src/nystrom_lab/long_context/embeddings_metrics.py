"""Scores and report of the long-document embedding experiment (:mod:`nystrom_lab.long_context.embeddings`).

Legend: D documents, e embedding width.

- **Half-document retrieval**: the query is a document's first half; the candidates are all 2D halves but
  the query itself (first and second halves of every document); the answer is its own second half. Top-1
  accuracy and mean reciprocal rank (chance: 1 / (2D − 1) and about ln(2D) / (2D)).
- **Genre by nearest neighbours**: leave-one-out k-NN over the whole-document embeddings by cosine
  similarity, majority vote (a tie goes to the class with the highest summed similarity), for Brown's 4
  groups and its 15 genre letters (:data:`nystrom_lab.data.brown_genres.GENRES`).
"""

from __future__ import annotations

import numpy as np


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (cosine similarity is then a dot product)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def half_retrieval(first: np.ndarray, second: np.ndarray) -> dict[str, float]:
    """``first``, ``second`` (D, e): top-1 accuracy and MRR of finding second[i] from first[i] among all 2D
    halves but first[i]."""
    d = len(first)
    halves = unit(np.concatenate([first, second]))  # (2D, e)
    scores = unit(first) @ halves.T  # (D, 2D)
    scores[np.arange(d), np.arange(d)] = -np.inf  # the query is no candidate
    target = scores[np.arange(d), d + np.arange(d)]
    ranks = 1 + (scores > target[:, None]).sum(axis=1)  # ties count in the answer's favour
    return {"top1": float((ranks == 1).mean()), "mrr": float((1.0 / ranks).mean()),
            "chance_top1": 1.0 / (2 * d - 1)}  # fmt: skip


def knn_accuracy(embeddings: np.ndarray, labels: list[str], *, k: int) -> float:
    """Leave-one-out k-NN accuracy (cosine, majority vote; ties broken by summed similarity)."""
    x = unit(embeddings)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    k = min(k, len(labels) - 1)
    right = 0
    for i, row in enumerate(sims):
        near = np.argsort(-row, kind="stable")[:k]
        votes: dict[str, tuple[int, float]] = {}
        for j in near:
            n, s = votes.get(labels[j], (0, 0.0))
            votes[labels[j]] = (n + 1, s + float(row[j]))
        right += max(votes, key=votes.get) == labels[i]
    return right / len(labels)


def majority_share(labels: list[str]) -> float:
    """Accuracy of always answering the most frequent label."""
    return max(labels.count(a) for a in set(labels)) / len(labels)


def render(res: dict) -> str:
    """The Markdown report of a results dict (see ``embeddings.run``)."""
    s = res["settings"]
    toy = "**Toy run** (not the experiment's result): " if s["toy"] else ""
    ks = s["k"]
    head = ["variant", "inputs", "tokens/input (mean)", "cut inputs", "retrieval top-1", "MRR"]
    head += [f"genre group {k}-NN" for k in ks] + [f"genre letter {k}-NN" for k in ks] + ["wall s", "CPU s"]
    lines = [
        "# Long-document embeddings on Brown (sentence-transformers)", "",
        f"{toy}{res['documents']} documents"
        + ("" if s.get("split", "all") == "all" else f" ({s['split']}: "
           + ("never seen by a contrastive continuation)" if s["split"] == "held-out" else "a continuation's own)"))
        + f", {2 * res['documents']} halves"
        + (f" cut to {s['half_tokens']} tokens" if s["half_tokens"] else " (whole)")
        + f"; {s['threads']} CPU threads; command: `{s['command']}`.", "",
        f"Chance: retrieval top-1 {res['chance']['top1']:.4f}; genre majority class {res['chance']['group']:.3f}"
        f" (groups), {res['chance']['letter']:.3f} (letters).", "",
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
    ]  # fmt: skip
    for name, v in res["variants"].items():
        row = [name, v["how"], f"{v['tokens_per_input']:.0f}", str(v["cut_inputs"]),
               f"{v['retrieval']['top1']:.3f}", f"{v['retrieval']['mrr']:.3f}"]  # fmt: skip
        row += [f"{v['genre_group'][str(k)]:.3f}" for k in ks] + [
            f"{v['genre_letter'][str(k)]:.3f}" for k in ks
        ]
        lines.append("| " + " | ".join([*row, f"{v['seconds']:.0f}", f"{v['cpu_seconds']:.0f}"]) + " |")
    lines += [
        "", "Retrieval: the first half of each document finds its second half among all halves (the query left"
        " out). Genre: leave-one-out k-NN over whole-document embeddings (cosine). A cut input is one longer"
        " than the variant's max_seq_length, which sentence-transformers cuts to its first max_seq_length"
        " tokens.", "",
    ]  # fmt: skip
    return "\n".join(lines)
