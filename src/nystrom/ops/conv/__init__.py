"""The depthwise conv skip of V over the sequence as an op: ``naive`` (the plain reference; a leaf only the
tests import), ``banded`` (the CPU's banded GEMMs) and ``dispatch`` (:func:`conv_skip`,
:func:`add_conv_skip`: the one choice)."""

from nystrom.ops.conv.banded import depthwise_seq_conv, depthwise_seq_conv_add_
from nystrom.ops.conv.dispatch import add_conv_skip, conv_path, conv_skip, conv_taps

__all__ = [
    "add_conv_skip",
    "conv_path",
    "conv_skip",
    "conv_taps",
    "depthwise_seq_conv",
    "depthwise_seq_conv_add_",
]
