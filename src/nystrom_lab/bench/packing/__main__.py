"""``python -m nystrom_lab.bench.packing --corpus FILE... [options]``: packed vs padded pre-training rows
(:mod:`nystrom_lab.bench.packing.driver`); writes OUT/bench_packing.json and OUT/bench_packing.md (the table,
also printed)."""

from __future__ import annotations

import sys

from nystrom_lab.argtypes import ArgumentParser, existing_file, non_negative_int, output_dir, positive_int
from nystrom_lab.attention_spec import attention
from nystrom_lab.bench.packing import driver
from nystrom_lab.bench.packing.report import render
from nystrom_lab.bench.record import command_line, write_record


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m nystrom_lab.bench.packing",
        description=(driver.__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--corpus", type=existing_file, nargs="+", required=True, help="e.g. data/brown/brown.txt")
    p.add_argument(
        "--max-length", type=positive_int, nargs="+", default=[512, 2048, 4096], help="row lengths L"
    )
    p.add_argument(
        "--layouts", nargs="+", choices=driver.LAYOUTS, default=["padded", "packed"],
        help="padded (--packing off), packed (--packing documents), stream (--packing stream: cross-talk)",
    )  # fmt: skip
    p.add_argument("--tokens-per-step", type=positive_int, default=8192, help="rows per step = this / L")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed interleaved rounds (default 5)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed rounds first (default 1)")
    p.add_argument(
        "--attention", type=attention, default="nystrom", metavar="SPEC",
        help="attention spec of the model, read as the text commands read it (default nystrom)",
    )  # fmt: skip
    p.add_argument("--hidden", type=positive_int, default=384, help="width e (default 384: MiniLM)")
    p.add_argument("--layers", type=positive_int, default=6, help="layers (default 6)")
    p.add_argument("--heads", type=positive_int, default=12, help="heads (default 12)")
    p.add_argument("--ffn", type=positive_int, default=1536, help="FFN width f (default 1536)")
    p.add_argument("--tokenizer", type=existing_file, help="tokenizer.json (default MiniLM's WordPiece)")
    p.add_argument("--seed", type=int, default=0, help="row order, packing order, masks (default 0)")
    p.add_argument(
        "--out", type=output_dir, default="runs/bench/packing", help="folder of bench_packing.{json,md}"
    )
    p.add_argument("--cache", type=output_dir, default="runs/bench/packing-cache", help="token cache folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    model_kw = dict(attention=a.attention, hidden=a.hidden, layers=a.layers, heads=a.heads, ffn=a.ffn)
    res = driver.run(
        a.corpus, lengths=tuple(a.max_length), layouts=tuple(a.layouts), tokenizer=a.tokenizer, cache=a.cache,
        tokens_per_step=a.tokens_per_step, rounds=a.rounds, warmup=a.warmup, model_kw=model_kw, seed=a.seed,
        command=command_line("nystrom_lab.bench.packing", argv),
        progress=not a.no_progress,
    )  # fmt: skip
    write_record(a.out, "bench_packing", res, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
