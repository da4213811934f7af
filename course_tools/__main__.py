"""Command line of the course tooling.

    python -m course_tools release [CHAPTER|all]    regenerate notebooks/ from solutions/
    python -m course_tools book                     build the HTML book into _build/html
    python -m course_tools book --chapter CHAPTER   rebuild one chapter into the built book
    python -m course_tools book --only CHAPTER      run one chapter and record what it glues
    python -m course_tools collect CHAPTER ZIP_OR_FOLDER [--pattern REGEX]
                                                    file an LMS export for grading
    python -m course_tools grade CHAPTER [--jobs N] [--unsandboxed] [--all-cells]
                                                    autograde, feedback, grades/CHAPTER.csv
    python -m course_tools grade CHAPTER --shard K/N   the K-th of N shares (one per machine)
    python -m course_tools merge CHAPTER            join the shares: grades, feedback
    python -m course_tools export CHAPTER           grades and feedback after manual grading
    python -m course_tools similar CHAPTER          answers compared: grading/similarity/CHAPTER.html
    python -m course_tools.catalogues.mutants CHAPTER   mutation-test the chapter's graders
    python -m course_tools.student.check NOTEBOOK       a student's self-check
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_tools import config
from course_tools.book import build as book
from course_tools.book import glue_records, release
from course_tools.grading.grader import collect, grade, similarity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_tools", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("release", help="regenerate student notebooks from solutions")
    p.add_argument("chapter", nargs="?", default="all")
    p = sub.add_parser("book", help="build the HTML book")
    p.add_argument("--chapter", metavar="CHAPTER", default="all",
                   help="rebuild only this chapter into the book an earlier build made (default: all)")
    p.add_argument("--only", metavar="CHAPTER",
                   help="only run this chapter and record the values its prose quotes (for release)")
    p = sub.add_parser("collect", help="file a zip or folder of submissions for grading",
                       description="File an LMS export (a zip or a folder) under grading/submitted/, one "
                       "folder per student, keyed by the LMS's own id.",
                       epilog=collect.NAMING_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chapter", help="the chapter, e.g. 03 or 03_transformer")
    p.add_argument("source", type=Path, help="the LMS's zip file or a folder")
    p.add_argument("--pattern", help="your own regex on file names, with a 'student' and/or an 'id' group "
                   "(and optionally 'timestamp'), used instead of the built-in ones")
    p.add_argument("--grading-dir", type=Path, default=None, help="default: grading/ in the repository")
    p = sub.add_parser("grade", help="autograde the collected submissions of one chapter")
    p.add_argument("chapter")
    p.add_argument("--grading-dir", type=Path, default=None)
    p.add_argument("--jobs", type=int, default=None, help="students graded at once (default: cores)")
    p.add_argument("--unsandboxed", action="store_true",
                   help="grade even where no sandbox can be made (only for submissions you trust)")
    p.add_argument("--all-cells", action="store_true",
                   help="also run the chapter's unchanged demonstration cells, which no test needs")
    p.add_argument("--shard", metavar="K/N", type=grade.parse_shard, default=None,
                   help="grade only the K-th of N shares of the class (another machine grades each other "
                   "share); then run merge")
    p = sub.add_parser("merge", help="join the shares graded with grade --shard into grades and feedback")
    p.add_argument("chapter")
    p.add_argument("--grading-dir", type=Path, default=None)
    p.add_argument("--shards", type=int, default=None, help="N (default: the one N found)")
    p = sub.add_parser("export", help="rewrite grades and feedback after manual grading")
    p.add_argument("chapter")
    p.add_argument("--grading-dir", type=Path, default=None)
    p = sub.add_parser("similar", help="compare the answers with each other and the solution (HTML)")
    p.add_argument("chapter")
    p.add_argument("--grading-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.command == "release":
        for chapter in config.resolve_chapters(args.chapter):
            print(f"Released {release.release(chapter).relative_to(config.root())}")
    elif args.command == "book" and args.only:
        for chapter in config.resolve_chapters(args.only):
            run = book.measure(chapter)
            print(f"{chapter}: {run.seconds:.1f} s; glued values in {glue_records.build_path(chapter)}")
    elif args.command == "book":
        html, failures = book.build(None if args.chapter == "all" else config.resolve_chapters(args.chapter))
        print(f"Book written to {html}/index.html")
        if failures:
            print(f"{len(failures)} chapter(s) failed to run, built without outputs:", file=sys.stderr)
            for fail in failures:
                print(f"  {fail.line()}", file=sys.stderr)
            return 1
    elif args.command == "collect":
        (chapter,) = config.resolve_chapters(args.chapter)
        report = collect.collect(chapter, args.source, args.grading_dir, args.pattern)
        print("\n".join(report.lines()))
    elif args.command == "grade":
        for chapter in config.resolve_chapters(args.chapter):
            path = grade.grade(chapter, args.grading_dir, args.jobs, args.unsandboxed, args.all_cells,
                               args.shard)
            print(f"Share {args.shard[0]}/{args.shard[1]} of {chapter} graded ({path}); run merge when "
                  "every share is" if args.shard else f"Grades written to {path}")
    elif args.command == "merge":
        for chapter in config.resolve_chapters(args.chapter):
            print(f"Grades written to {grade.merge(chapter, args.grading_dir, args.shards)}")
    elif args.command == "export":
        for chapter in config.resolve_chapters(args.chapter):
            print(f"Grades written to {grade.export(chapter, args.grading_dir)}")
    elif args.command == "similar":
        for chapter in config.resolve_chapters(args.chapter):
            print(f"Similarity report written to {similarity.write_report(chapter, args.grading_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
