#!/usr/bin/env python3
"""Check the first markdown table of bench/RESULTS.md (issue 38 item 2).

The table at the top of the results page is a summary: one row per headline, one figure and its
baseline per cell, one date and commit per row. Dated runs and their reasoning belong in
bench/results/. This script fails (exit 1) when, in the first table of the given file:

- any cell is 120 characters or longer (the cell's markdown source, trimmed);
- a row has a different number of cells from the header;
- a row has no cell holding both a date (YYYY-MM-DD) and a commit (7 to 40 hex digits). If a
  header cell names both "date" and "commit", that column is the one checked.

Usage: check_results_table.py [path/to/RESULTS.md]   (stdlib only)
"""

import re
import sys

MAX_CELL = 120  # a cell must be shorter than this
DATE = re.compile(r"(?<![\d-])\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?![\d-])")
COMMIT = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
SEPARATOR_CELL = re.compile(r"^:?-{3,}:?$")


def split_row(line):
    """Cells of a table row: split on '|' not escaped by a backslash, outer pipes dropped."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", body)]


def first_table(lines):
    """(line number, text) of every row of the first table outside code fences, or []."""
    in_fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence or not line.lstrip().startswith("|") or i + 1 >= len(lines):
            continue
        separator = split_row(lines[i + 1])
        if not separator or not all(SEPARATOR_CELL.match(c) for c in separator):
            continue
        rows = []
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            rows.append((j + 1, lines[j].rstrip("\n")))
            j += 1
        return rows
    return []


def has_date_and_commit(cell):
    # A date's digits never count as a commit.
    return bool(DATE.search(cell)) and bool(COMMIT.search(DATE.sub(" ", cell)))


def check(path):
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    rows = first_table(lines)
    if not rows:
        return [f"{path}: no markdown table found"]
    errors = []
    header = split_row(rows[0][1])
    date_column = None
    for k, name in enumerate(header):
        if re.search(r"date", name, re.I) and re.search(r"commit", name, re.I):
            date_column = k
            break
    for number, text in rows:
        cells = split_row(text)
        for k, cell in enumerate(cells):
            if len(cell) >= MAX_CELL:
                errors.append(f"{path}:{number}: cell {k + 1} has {len(cell)} characters "
                              f"(must be under {MAX_CELL}): {cell[:60]}...")
        if number == rows[0][0] or number == rows[1][0]:
            continue  # header and separator
        if len(cells) != len(header):
            errors.append(f"{path}:{number}: {len(cells)} cells, the header has {len(header)}")
        if date_column is not None and date_column < len(cells):
            candidates = [cells[date_column]]
        else:
            candidates = cells
        if not any(has_date_and_commit(c) for c in candidates):
            where = f"column '{header[date_column]}'" if date_column is not None else "any cell"
            errors.append(f"{path}:{number}: no date (YYYY-MM-DD) and commit (7+ hex digits) "
                          f"in {where}: {cells[0][:60]}")
    return errors


def main(argv):
    path = argv[1] if len(argv) > 1 else "bench/RESULTS.md"
    errors = check(path)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"FAIL: {len(errors)} problem(s) in the first table of {path}", file=sys.stderr)
        return 1
    rows = len(first_table(open(path, encoding="utf-8").readlines())) - 2
    print(f"OK: the first table of {path} ({rows} rows): every cell under {MAX_CELL} "
          f"characters, every row dated with a commit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
