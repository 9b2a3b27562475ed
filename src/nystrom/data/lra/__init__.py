"""Long Range Arena data: local generators (ListOps, Pathfinder) and loaders for the released formats.

Legend: N examples, L max_length, W image side.

Generators: :func:`generate_listops` (``basic_{train,val,test}.tsv``), :func:`generate_pathfinder`
(``curv_*/imgs`` + ``metadata``). Loaders, each a ``torch.utils.data.Dataset`` of int64 tensors:
:func:`load_listops`, :func:`load_imdb`, :func:`load_aan`, :func:`load_cifar10`, :func:`load_pathfinder`.
"""

from typing import TYPE_CHECKING

from nystrom._lazy import lazy_attributes

_NAMES = {
    "BYTE_VOCAB_SIZE": "nystrom.data.lra.tokenize",
    "LISTOPS_VOCAB": "nystrom.data.lra.tokenize",
    "LISTOPS_VOCAB_SIZE": "nystrom.data.lra.tokenize",
    "ListOpsConfig": "nystrom.data.lra.listops",
    "PAD_ID": "nystrom.data.lra.tokenize",
    "PIXEL_VOCAB_SIZE": "nystrom.data.lra.tokenize",
    "PairDataset": "nystrom.data.lra.dataset",
    "PathfinderConfig": "nystrom.data.lra.pathfinder",
    "PixelDataset": "nystrom.data.lra.dataset",
    "RaggedTokens": "nystrom.data.lra.dataset",
    "SequenceDataset": "nystrom.data.lra.dataset",
    "encode_bytes": "nystrom.data.lra.tokenize",
    "encode_listops": "nystrom.data.lra.tokenize",
    "evaluate_listops": "nystrom.data.lra.listops_eval",
    "generate_listops": "nystrom.data.lra.listops",
    "generate_pathfinder": "nystrom.data.lra.pathfinder_io",
    "iter_listops": "nystrom.data.lra.listops",
    "load_aan": "nystrom.data.lra.loaders",
    "load_cifar10": "nystrom.data.lra.cifar",
    "load_imdb": "nystrom.data.lra.loaders",
    "load_listops": "nystrom.data.lra.loaders",
    "load_listops_file": "nystrom.data.lra.loaders",
    "load_pathfinder": "nystrom.data.lra.pathfinder_io",
    "read_listops_tsv": "nystrom.data.lra.listops",
    "read_metadata": "nystrom.data.lra.pathfinder_io",
    "read_png": "nystrom.data.lra.png",
    "sample_pathfinder": "nystrom.data.lra.pathfinder_sample",
    "write_png": "nystrom.data.lra.png",
}
__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
__all__ = sorted(_NAMES)

if TYPE_CHECKING:
    from nystrom.data.lra.cifar import load_cifar10
    from nystrom.data.lra.dataset import PairDataset, PixelDataset, RaggedTokens, SequenceDataset
    from nystrom.data.lra.listops import ListOpsConfig, generate_listops, iter_listops, read_listops_tsv
    from nystrom.data.lra.listops_eval import evaluate_listops
    from nystrom.data.lra.loaders import load_aan, load_imdb, load_listops, load_listops_file
    from nystrom.data.lra.pathfinder import PathfinderConfig
    from nystrom.data.lra.pathfinder_io import generate_pathfinder, load_pathfinder, read_metadata
    from nystrom.data.lra.pathfinder_sample import sample_pathfinder
    from nystrom.data.lra.png import read_png, write_png
    from nystrom.data.lra.tokenize import (
        BYTE_VOCAB_SIZE,
        LISTOPS_VOCAB,
        LISTOPS_VOCAB_SIZE,
        PAD_ID,
        PIXEL_VOCAB_SIZE,
        encode_bytes,
        encode_listops,
    )
