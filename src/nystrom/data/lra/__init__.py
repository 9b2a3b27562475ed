"""Long Range Arena data: local generators (ListOps, Pathfinder) and loaders for the released formats.

Legend: N examples, L max_length, W image side.

Generators: :func:`generate_listops` (``basic_{train,val,test}.tsv``), :func:`generate_pathfinder`
(``curv_*/imgs`` + ``metadata``). Loaders, each a ``torch.utils.data.Dataset`` of int64 tensors:
:func:`load_listops`, :func:`load_imdb`, :func:`load_aan`, :func:`load_cifar10`, :func:`load_pathfinder`.
"""

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

__all__ = [
    "BYTE_VOCAB_SIZE",
    "LISTOPS_VOCAB",
    "LISTOPS_VOCAB_SIZE",
    "PAD_ID",
    "PIXEL_VOCAB_SIZE",
    "ListOpsConfig",
    "PairDataset",
    "PathfinderConfig",
    "PixelDataset",
    "RaggedTokens",
    "SequenceDataset",
    "encode_bytes",
    "encode_listops",
    "evaluate_listops",
    "generate_listops",
    "generate_pathfinder",
    "iter_listops",
    "load_aan",
    "load_cifar10",
    "load_imdb",
    "load_listops",
    "load_listops_file",
    "load_pathfinder",
    "read_listops_tsv",
    "read_metadata",
    "read_png",
    "sample_pathfinder",
    "write_png",
]
