#!/usr/bin/env python3
"""Fails when the README stops being a ten-minute read that leads to every docs page.

usage: check_readme.py --root SOURCE_DIR [--max-lines N]

Checks that README.md has at most N lines (250 unless told) and that every page docs/*.md is
the target of a markdown link in README.md (links resolved from README.md's folder, an
#anchor ignored). Whether those links and their anchors resolve is check_doc_names.py's job.
Standard library only.
"""
import argparse
import pathlib
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def linked_files(readme):
    """The files README.md links to, resolved; links inside code fences do not count."""
    targets, in_fence = set(), False
    for line in readme.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(line):
            path = target.split("#", 1)[0]
            if path and "://" not in path:
                targets.add((readme.parent / path).resolve())
    return targets


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=pathlib.Path)
    parser.add_argument("--max-lines", type=int, default=250)
    args = parser.parse_args()
    root = args.root.resolve()
    readme = root / "README.md"
    if not readme.exists():
        print("README.md does not exist")
        return 1
    failures = 0
    lines = len(readme.read_text().splitlines())
    if lines > args.max_lines:
        failures += 1
        print("README.md has %d lines, more than %d: move detail to a docs/ page and link it" %
              (lines, args.max_lines))
    pages = sorted((root / "docs").glob("*.md"))
    if not pages:
        failures += 1
        print("no docs/*.md page found under %s" % root)
    linked = linked_files(readme)
    for page in pages:
        if page.resolve() not in linked:
            failures += 1
            print("README.md does not link docs/%s: add it to the README's map of docs/" %
                  page.name)
    print("README.md: %d lines (at most %d), %d docs pages, %d linked" %
          (lines, args.max_lines, len(pages), sum(p.resolve() in linked for p in pages)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
