"""``nystrom docs render`` (rewrite every measured table of README.md and docs/ from the committed data,
``--plots``: redraw the figures drawn from data too) and ``nystrom docs check`` (exit 1 listing the stale
blocks). ``register(subparsers)`` adds them to :mod:`nystrom_lab.cli`'s parser; the work is imported only
when a command runs, so ``nystrom --help`` stays fast."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _root(args: argparse.Namespace) -> Path:
    """The repository to render: ``--root``, or the one holding the current folder."""
    from nystrom_lab.docs.render import find_root

    return find_root(Path.cwd()) if args.root is None else args.root


def _cmd_render(args: argparse.Namespace) -> int:
    """``nystrom docs render [--plots]``."""
    from nystrom_lab.docs.render import write

    root = _root(args)
    changed = write(root)
    print("\n".join(f"rendered {c}" for c in changed) or "every block was up to date")
    if args.plots:
        from nystrom_lab.docs.plots import draw

        for png in draw(root):
            print(f"drew {png.relative_to(root)}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    """``nystrom docs check``: exit 1 listing what differs from the data."""
    from nystrom_lab.docs.render import problems

    found = problems(_root(args))
    if found:
        sys.stderr.write("\n".join(found) + "\nhint: `nystrom docs render` rewrites them from the data\n")
        return 1
    print("every rendered block matches its data")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``docs render`` and ``docs check`` to the ``nystrom`` command's sub-parsers."""
    d = subparsers.add_parser(
        "docs", help="render the docs' measured tables from the committed data, or check them"
    )
    actions = d.add_subparsers(dest="action", required=True)
    r = actions.add_parser("render", help="rewrite every rendered block of README.md and docs/ from its data")
    r.add_argument("--plots", action="store_true", help="also redraw the figures drawn from data files")
    r.set_defaults(func=_cmd_render)
    c = actions.add_parser("check", help="exit 1 listing every block that differs from what its data renders")
    c.set_defaults(func=_cmd_check)
    for p in (r, c):
        p.add_argument(
            "--root", type=Path, help="the repository (default: the one holding the current folder)"
        )
