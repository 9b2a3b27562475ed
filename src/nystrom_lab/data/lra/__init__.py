"""Long Range Arena data: local generators (ListOps, Pathfinder) and loaders for the released formats.

Legend: N examples, L max_length, W image side.

Import from the modules (this package re-exports nothing, so the command line can read one module without
loading numpy or torch): generators ``listops.generate_listops`` (``basic_{train,val,test}.tsv``) and
``pathfinder_io.generate_pathfinder`` (``curv_*/imgs`` + ``metadata``); loaders, each a
``torch.utils.data.Dataset`` of int64 tensors: ``loaders.load_listops``, ``loaders.load_imdb``,
``loaders.load_aan``, ``cifar.load_cifar10``, ``pathfinder_io.load_pathfinder``.
"""
