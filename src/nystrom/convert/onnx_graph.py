"""The forward that :func:`~nystrom.convert.onnx_export.export_onnx` traces: the model with a fixed tuple of
outputs, and (for models of ours, by default) a branch on "every token real".

Legend: b batch, r choices (multiple choice), n tokens.

Why the branch: with every token real, the eager model drops the all-True ``attention_mask`` after one
check on the host (:func:`nystrom.utils.checks.check_mask`) and runs the unmasked path. A graph cannot read
the mask's values while it is built, so without the branch ONNX Runtime computes every masked operation on
every call: the ``Where`` that zeroes padded hidden states and values, and the key and landmark biases of
the softmaxes (with the branch ORT took 0.84-0.99x the masked graph's time, MiniLM size, 512 to 16K tokens,
batch 1 and 8). ``torch.cond`` on "every token real and n ≥ m" (m: the most landmarks of any Nyström
layer) becomes an ONNX ``If`` whose two subgraphs share the weights (initializers of the main graph): the
unpadded one is the model called without a mask, the other the model with it. With n ≥ m every landmark
holds a token, so the unpadded branch also leaves out the landmarks' validity bias
(:func:`~nystrom.ops.nystrom.landmarks.every_landmark_used`); shorter inputs take the masked branch. ``If``
costs two reductions of the mask per call; the file grows by the second subgraph's nodes (not its weights)
and the export takes about three times as long. Each branch's ``Conv`` gets its own copy of its small weight
(:func:`copy_conv_weights_into_branches`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from nystrom.attention.nystrom import NystromAttention
from nystrom.model.configuration_nystromformer import MODEL_TYPE
from nystrom.ops.nystrom.landmarks import every_landmark_used


class ExportedForward(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]), each (b, n) or (b, r, n) -> the output fields named in
    ``outputs``, in that order.

    ``unpadded_branch``: the outputs come from an ``If`` on every token real and n ≥ :attr:`min_length` (see
    the module docstring); False traces the masked model alone (one subgraph fewer, slower where no token
    is padded).
    """

    def __init__(self, model: nn.Module, outputs: list[str], *, unpadded_branch: bool) -> None:
        super().__init__()
        self.model = model
        self.outputs = outputs
        self.unpadded_branch = unpadded_branch
        # Only in models of ours is every Nyström layer a NystromAttention module whose m can be read here
        # (transformers' models with attn_implementation="nystrom" take m from their config, and their
        # forward does not trace under torch.cond): elsewhere the unpadded branch keeps the validity.
        self.landmarks_known = getattr(getattr(model, "config", None), "model_type", None) == MODEL_TYPE
        #: the fewest tokens with which every Nyström layer's landmarks all hold one (its largest m)
        self.min_length = max(
            (mod.num_landmarks for mod in model.modules() if isinstance(mod, NystromAttention)), default=1
        )

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        """The model's outputs named in ``outputs``; ``attention_mask`` None = every token real."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra)
        return tuple(out[name] for name in self.outputs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if not self.unpadded_branch:
            return self.run(input_ids, attention_mask, token_type_ids)
        # torch.cond's operands are tensors: the token types are one more operand where the model takes them
        types = () if token_type_ids is None else (token_type_ids,)
        real = attention_mask.bool()  # (b, n) or (b, r, n)
        unpadded = real.all() & (real.sum(-1) >= self.min_length).all()  # () bool: all real, n ≥ m
        operands = (input_ids, attention_mask, *types)
        # Set around the whole If (Dynamo traces its branches and cannot enter a context manager inside one);
        # it changes calls without a mask only, which only the unpadded branch makes.
        with every_landmark_used() if self.landmarks_known else contextlib.nullcontext():
            outs = torch.cond(unpadded, self._branch(masked=False), self._branch(masked=True), operands)
        return tuple(outs)

    def _branch(self, *, masked: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
        """One side of the ``If``: the model with the mask, or without it (every token real). Each output is
        a tensor of its own: torch.cond refuses outputs that alias each other (question answering's start
        and end logits are two views of one tensor); the copies export as ``Identity``."""

        def branch(ids: torch.Tensor, mask: torch.Tensor, *types: torch.Tensor) -> tuple[torch.Tensor, ...]:
            outs = self.run(ids, mask if masked else None, types[0] if types else None)
            return tuple(t.clone() for t in outs)

        return branch


def all_graphs(graph) -> list:
    """``graph`` and every subgraph inside it (the ``If``'s branches, the ``Scan`` bodies): the graph first."""
    found, todo = [], [graph]
    while todo:
        g = todo.pop()
        found.append(g)
        todo += [a.g for n in g.node for a in n.attribute if a.type == a.GRAPH]
    return found


def copy_conv_weights_into_branches(model) -> int:
    """Give every ``Conv`` inside a subgraph (the ``If``'s branches) its own copy of the weight and bias it
    reads from the main graph of the ONNX ``model`` (changed in place). Returns the number of tensors copied.

    Why: ONNX Runtime's NCHWc layout transformer, which runs the depthwise conv skip 5× faster, takes a
    ``Conv`` only when its weight is an initializer of the conv's own graph, not of an enclosing one (the
    skip was 105 vs 21 ms per call at 4K tokens, batch 1). The copies are small (h × K per layer).
    """
    import onnx

    outer = {t.name: t for t in model.graph.initializer}
    copied = 0
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type != onnx.AttributeProto.GRAPH:
                continue
            branch = attribute.g
            for conv in (n for n in branch.node if n.op_type == "Conv"):
                for i in range(1, len(conv.input)):  # weight, bias
                    if conv.input[i] not in outer:
                        continue
                    local = onnx.TensorProto()
                    local.CopyFrom(outer[conv.input[i]])
                    local.name = f"{attribute.name}.{conv.name}.{conv.input[i]}"
                    branch.initializer.append(local)
                    conv.input[i] = local.name
                    copied += 1
    return copied


def drop_unused_initializers(model) -> list[str]:
    """Remove the initializers that no node of the ONNX ``model`` (any subgraph included) reads and no graph
    outputs (changed in place); returns their names. Why: ONNX Runtime removes them itself, but warns once per
    initializer every time a session loads the file (the main graph's conv weights once the branches hold
    copies, and a few constants that torch.onnx leaves behind)."""
    graphs = all_graphs(model.graph)
    read = {i for g in graphs for n in g.node for i in n.input} | {o.name for g in graphs for o in g.output}
    dropped = []
    for g in graphs:
        keep = [t for t in g.initializer if t.name in read]
        dropped += [t.name for t in g.initializer if t.name not in read]
        del g.initializer[:]
        g.initializer.extend(keep)
    return dropped


def finish_graph(path: str | Path, *, branches: bool) -> None:
    """The file torch.onnx wrote, rewritten in place: with ``branches`` (the ``If`` on every token real), the
    conv weights copied into them (:func:`copy_conv_weights_into_branches`); then the initializers that nothing
    reads dropped (:func:`drop_unused_initializers`)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    changed = copy_conv_weights_into_branches(model) if branches else 0
    if changed + len(drop_unused_initializers(model)):
        onnx.save(model, str(path))
