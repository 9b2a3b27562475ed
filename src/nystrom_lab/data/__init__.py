"""Data for the paper's experiments; :mod:`nystrom_lab.data.lra` holds the Long Range Arena tasks.

Sub-packages are imported explicitly (``from nystrom_lab.data.lra.loaders import load_listops``) so that importing
``nystrom_lab.data`` stays cheap. Every reader reports a file it cannot use as :class:`DataFileError` (a
``ValueError`` naming the file and line) and a missing one as ``FileNotFoundError``.
"""

from nystrom_lab.data.file_checks import DataFileError

__all__ = ["DataFileError"]
