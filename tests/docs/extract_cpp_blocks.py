#!/usr/bin/env python3
"""Writes the ```cpp blocks of a markdown file, in order, into one C++ source file.

usage: extract_cpp_blocks.py DOC OUTPUT

Each block is preceded by a #line directive naming the doc and the block's first line, so a
compiler error points at the doc. A doc without a ```cpp block is a failure: the program built
from it would test nothing. The output is rewritten on every run (the build reruns this when
the doc changes). Standard library only.
"""
import pathlib
import re
import sys

FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\S*)")


def cpp_blocks(lines):
    """(first line number, text) of every ```cpp (or ```c++) block."""
    blocks, fence, language, start, body = [], None, None, 0, []
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, language, start, body = match.group(1), match.group(2).lower(), number + 1, []
        elif line.strip() == fence:  # a closing fence: the opening's characters, nothing else
            if language in ("cpp", "c++"):
                blocks.append((start, "".join(body)))
            fence = None
        else:
            body.append(line)
    return blocks


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    doc, output = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2])
    blocks = cpp_blocks(doc.read_text().splitlines(keepends=True))
    if not blocks:
        print("%s: no ```cpp block to build" % doc, file=sys.stderr)
        return 1
    text = "// Generated from %s by extract_cpp_blocks.py: edit the doc, not this file.\n" % doc
    for start, body in blocks:
        text += '#line %d "%s"\n%s' % (start, doc, body)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
