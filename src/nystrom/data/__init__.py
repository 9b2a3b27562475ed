"""Data for the paper's experiments; :mod:`nystrom.data.lra` holds the Long Range Arena tasks.

Sub-packages are imported explicitly (``from nystrom.data.lra import load_listops``) so that importing
``nystrom.data`` stays cheap.
"""
