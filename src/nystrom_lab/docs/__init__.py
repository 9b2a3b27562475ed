"""Docs rendered from data: every table of measured numbers in README.md and docs/ is a marked block
that ``nystrom docs render`` rewrites from the committed JSON/CSV (``registry.BLOCKS`` lists them) and
``nystrom docs check`` compares with what the data renders to now.

Nothing is imported here: the bench writers import :mod:`nystrom_lab.docs.markers` alone, and the
registry imports the bench report modules, so loading one must not load the other.
"""
