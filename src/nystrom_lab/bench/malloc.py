"""The C allocator settings the training benchmark can run its children under (no torch import: the CLI
lists them in its help)."""

from __future__ import annotations

import os
import platform

#: How the children's C allocator treats large blocks (``nystrom bench training --malloc``).
#: ``system``: as the machine is set up; glibc maps every block of ≥ 32 MiB fresh and unmaps it on
#: free, so each large tensor's first touch page-faults, in every call. ``cached``: glibc allocates
#: from its heap only and never returns freed memory, so once the heap has settled (a few calls; the
#: benchmark's warm-up rounds) large tensors reuse pages already mapped (what a caching allocator such
#: as jemalloc, tcmalloc or CUDA's gives), at the price of resident memory that includes the heap's holes.
MALLOC = {
    "system": {},
    "cached": {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"},
}


def malloc_env(mode: str) -> dict[str, str]:
    """The environment variables of ``MALLOC[mode]``; raises where they would not take effect."""
    if mode not in MALLOC:
        raise ValueError(f"malloc mode must be one of {sorted(MALLOC)}, got {mode!r}")
    env = MALLOC[mode]
    if env and platform.libc_ver()[0] != "glibc":
        raise ValueError(f"--malloc {mode} sets glibc tunables, but this Python does not run on glibc")
    clash = [k for k in env if k in os.environ]
    if clash:
        raise ValueError(f"--malloc {mode} sets {clash}, already set in this environment; unset it first")
    return dict(env)
