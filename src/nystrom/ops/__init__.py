"""The attention ops, one folder each (as flash-linear-attention's ``ops/<op>/``): a plain ``naive``
reference where the op has one, its implementations, and one dispatch function that picks between them.

``nystrom`` (Nyström attention), ``pinv`` (the pseudo-inverse of its landmark kernel), ``softmax`` (exact
and block-diagonal softmax attention) and ``baselines`` (the other efficient attentions of the paper's
comparisons). They import only :mod:`nystrom.utils` and each other."""
