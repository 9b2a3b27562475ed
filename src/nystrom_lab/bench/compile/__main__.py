"""``python -m nystrom_lab.bench.compile [OUT.json]``: :func:`nystrom_lab.bench.compile.eager_vs_compiled.main`."""

import sys
from pathlib import Path

from nystrom_lab.bench.compile.eager_vs_compiled import main

main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
