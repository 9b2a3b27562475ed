"""nystrom_lab: the experiments, benchmarks and command line built on the ``nystrom`` library.

Layers, each importing only those before it: ``data`` (generators and readers) → ``training`` (the one
loop) → the experiments, one package each (``lra``: Long Range Arena; ``text``: pre-training, Figure 5,
fine-tuning, prediction, conversion; ``long_context``: long models from 512-token checkpoints, built on
``text``) → ``bench`` → ``cli`` (the ``nystrom`` console script). The library ``nystrom`` never
imports this package. Importing it is cheap: modules load torch and the library only when a command runs.
"""
