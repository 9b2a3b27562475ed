"""``python -m nystrom_lab.bench.lucidrains [OUT.json]``: :func:`nystrom_lab.bench.lucidrains.parity.main`."""

import sys
from pathlib import Path

from nystrom_lab.bench.lucidrains.parity import main

main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
