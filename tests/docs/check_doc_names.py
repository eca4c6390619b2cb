#!/usr/bin/env python3
"""Fails when a doc names a file, test binary, GoogleTest or ctest test that does not exist.

usage: check_doc_names.py --root SOURCE_DIR [--ctest CTEST --build-dir BUILD_DIR] [--verbose] DOC...

What a doc may name, and where it must exist:
  file paths (`graph/src/executor.cpp`, `loom/backend.hpp`)  the source tree, or an include/ dir
  `binary: Suite.Test`, `Suite.Test`, `Prefix/Suite.Test/param`  TEST/TEST_F/TEST_P in tests/**
      (in the binary's own sources when a binary is named); bare `Test` names after a
      `Suite.Test` in the same table cell or sentence are tests of that suite
  bad_inputs `Row`                                      a row of tests/backends/bad_inputs.hpp
  ctest names (`fault_mpi.np3`, `fuzz.timeout_env_fuzzer`)  tests/**/CMakeLists.txt, or the
      tests registered in BUILD_DIR (ctest -N) when given; a lowercase `a.b` is a ctest name
      when `a` starts a test's name there (or b is npN): others (`torch.save`, `net.module`,
      the node `bucket3.pack`) are code, not tests
  folders under a top-level folder (`backends/local`)    the source tree
  markdown links and images (`[x](../bench/RESULTS.md#2-scheduler)`, outside code fences)
      the file or folder, resolved from the doc's own folder; an #anchor must be the GitHub
      anchor of a heading of the target (of the doc itself when no file is given)
Every line of docs/ARCHITECTURE.md is at most 400 characters (MAX_LINE_LENGTH): a table row that
says more is split into rows, one per concern; a longer line is reported with its number and
length. A doc that does not exist is a failure (a check of nothing must not pass). With
--comments, the comments of every source file (C++, CMake, shell, Python) are checked too: the
paths they name (files, and folders under a top-level folder) must exist. Every missing name is
reported with its line. Standard library only.
"""
import argparse
import functools
import pathlib
import re
import subprocess
import sys

FILE_EXTENSIONS = ("cpp", "hpp", "h", "cu", "cuh", "cc", "c", "py", "sh", "md", "txt", "cmake",
                   "json", "in", "yml", "yaml", "clang-format")
PATH = re.compile(r"(?<![\w./<>:-])((?:[\w.-]+/)+[\w.-]+\.(?:%s))(?![\w/])" %
                  "|".join(re.escape(e) for e in FILE_EXTENSIONS))
URL = re.compile(r"\w+://\S+")
# A folder path in prose: two or more components, the first a top-level folder of the tree.
FOLDER = re.compile(r"(?<![\w./<>:$-])((?:[a-z_]+/)+[a-z_]+)/?(?![\w./-])")
SOURCE_SUFFIXES = (".cpp", ".hpp", ".h", ".cu", ".cuh", ".py", ".sh", ".cmake")
COMMENT = {".py": re.compile(r"#(.*)$"), ".sh": re.compile(r"#(.*)$"),
           ".cmake": re.compile(r"#(.*)$"), "CMakeLists.txt": re.compile(r"#(.*)$")}
CPP_COMMENT = re.compile(r"//(.*)$")
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
# Docs whose every line has a maximum length, by path from the root.
MAX_LINE_LENGTH = {pathlib.PurePosixPath("docs/ARCHITECTURE.md"): 400}
HEADING = re.compile(r"^#{1,6}\s+(.*?)[\s#]*$")
GTEST = re.compile(r"^(?:(?P<binary>\w+):\s*)?(?:\w+/)?(?P<suite>[A-Z]\w*)\.(?P<test>[A-Z]\w*)"
                   r"(?:/\S*)?$")
BARE_TEST = re.compile(r"^[A-Z][A-Za-z0-9_]*$")
CTEST = re.compile(r"^[a-z][\w-]*\.[\w-]+$")
TEST_MACRO = re.compile(r"\b(?:TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\(\s*(\w+)\s*,\s*(\w+)\s*\)")
ADD_TARGET = re.compile(r"\b(?:loom_add_test|loom_add_mpi_test|add_executable)\(\s*(\w+)([^)]*)\)")
MPI_TEST = re.compile(r"\bloom_add_mpi_test\(\s*(\w+)[^)]*\bRANKS((?:\s+\d+)+)")


class Tree:
    """What exists in the source tree (and, optionally, in the build's ctest list)."""

    def __init__(self, root, ctest=None, build_dir=None):
        self.root = root
        self.tests_dir = root / "tests"
        self.tests_by_file = {}  # path -> {(suite, test)}
        for path in sorted(self.tests_dir.rglob("*")):
            if path.suffix in (".cpp", ".hpp", ".h", ".cc", ".cu") and path.is_file():
                text = path.read_text(errors="replace")
                self.tests_by_file[path] = set(TEST_MACRO.findall(text))
        self.all_tests = set().union(*self.tests_by_file.values()) if self.tests_by_file else set()
        self.cmake_files = {p: p.read_text(errors="replace")
                            for p in sorted(self.tests_dir.rglob("CMakeLists.txt"))}
        self.binaries = {}  # binary name -> its source files
        for path, text in self.cmake_files.items():
            for name, args in ADD_TARGET.findall(text):
                if name.startswith("$"):
                    continue
                sources = {path.parent / a for a in args.split() if a.endswith((".cpp", ".cu"))}
                self.binaries.setdefault(name, set()).update(sources)
        for path in self.tests_by_file:  # loops like add_executable(${test} ${test}.cpp)
            self.binaries.setdefault(path.stem, set()).add(path)
        for name in self.binaries:
            self.binaries[name].update(p for p in self.tests_by_file if p.stem == name)
        self.mpi_ranks = {}
        for text in self.cmake_files.values():
            for name, ranks in MPI_TEST.findall(text):
                self.mpi_ranks[name] = set(ranks.split())
        self.registered = self._registered(ctest, build_dir)
        # What a ctest name starts with: `fault_mpi` of fault_mpi.np3, `docs` of docs.names_exist.
        self.ctest_prefixes = {n.split(".", 1)[0] for n in self.registered if "." in n}
        self.ctest_prefixes.update(self.mpi_ranks, ["fuzz"])
        for text in self.cmake_files.values():
            self.ctest_prefixes.update(re.findall(
                r"\b(?:add_test\(\s*NAME\s+|loom_expect_test\(\s*)([a-z][\w-]*)\.", text))
            self.ctest_prefixes.update(
                "torch_" + n for n in re.findall(r"\bloom_add_torch_test\(\s*(\w+)", text))
        self.top_level = {p.name for p in root.iterdir() if p.is_dir() and
                          not p.name.startswith((".", "build"))}

    @staticmethod
    def _registered(ctest, build_dir):
        if not ctest or not build_dir:
            return set()
        try:
            out = subprocess.run([ctest, "-N"], cwd=build_dir, capture_output=True, text=True,
                                 timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            return set()
        return set(re.findall(r"^\s*Test\s+#\d+:\s+(\S+)", out, re.M))

    def file_exists(self, path):
        if (self.root / path).exists():
            return True
        # An include path (`loom/backend.hpp`): under some <folder>/include/.
        return any((inc / path).exists() for inc in self.root.glob("*/include"))

    def folder_or_module_exists(self, path):
        """A folder (`backends/local`), or a module named by its layer and stem
        (`graph/executor`: graph/src/executor.cpp, graph/include/loom/executor.hpp)."""
        if (self.root / path).is_dir():
            return True
        layer, stem = path.split("/", 1)[0], path.rsplit("/", 1)[1]
        return any(p.stem == stem for p in (self.root / layer).rglob(stem + ".*"))

    def test_exists(self, suite, test, binary=None):
        if binary is None:
            return (suite, test) in self.all_tests
        return any((suite, test) in self.tests_by_file.get(f, ())
                   for f in self.binaries.get(binary, ()))

    def row_exists(self, row):
        table = self.tests_dir / "backends" / "bad_inputs.hpp"
        return table.exists() and ('{"%s",' % row) in table.read_text(errors="replace")

    def ctest_exists(self, name):
        if name in self.registered:
            return True
        prefix, suffix = name.split(".", 1)
        if prefix == "fuzz":  # tests/fuzz: each <what>_fuzzer.cpp is the ctest fuzz.<what>_fuzzer
            return (self.tests_dir / "fuzz" / (suffix + ".cpp")).exists()
        rank = re.fullmatch(r"np(\d+)", suffix)
        if rank and prefix in self.mpi_ranks:
            return rank.group(1) in self.mpi_ranks[prefix]
        # tests/torch: loom_add_torch_test(NAME ...) registers torch_NAME.np2 and .np3 where
        # loom_torch is built (not in the sanitizer builds).
        torch_test = re.fullmatch(r"torch_(\w+)", prefix)
        if rank and torch_test and rank.group(1) in ("2", "3") and any(
                re.search(r"\bloom_add_torch_test\(\s*%s\b" % torch_test.group(1), text)
                for text in self.cmake_files.values()):
            return True
        for text in self.cmake_files.values():
            if name in text:
                return True
            # add_test(NAME prefix.np${np}) in a foreach(np ...) over the rank counts
            if rank and re.search(r"\b%s\.np\$\{np\}" % re.escape(prefix), text) and \
                    re.search(r"\bforeach\(np\b[^)]*\b%s\b" % rank.group(1), text):
                return True
            # add_test(NAME prefix.${mode}) in a foreach over the suffixes
            if re.search(r"\b%s\.\$\{" % re.escape(prefix), text) and \
                    re.search(r"\bforeach\([^)]*\b%s\b" % re.escape(suffix), text):
                return True
        return False


def paths_on(tree, text, ours_only=False):
    """The file and folder paths named in `text`, as (what, exists). ours_only: only the paths
    that start at a top-level folder or loom/ (comments also name other projects' files)."""
    found = []
    for path in PATH.findall(text):
        if path.startswith(("build/", "/")) or "<" in path:
            continue
        if ours_only and path.split("/", 1)[0] not in tree.top_level | {"loom"}:
            continue
        found.append(("file %s" % path, tree.file_exists(path)))
    for folder in FOLDER.findall(text):
        if folder.split("/", 1)[0] in tree.top_level and not folder.startswith("build/"):
            found.append(("folder %s" % folder, tree.folder_or_module_exists(folder)))
    return found


def source_files(root):
    """Every tracked-looking source file of the tree (not build outputs, not hidden folders)."""
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if relative.parts[0].startswith(("build", ".")) or not path.is_file():
            continue
        if path.suffix in SOURCE_SUFFIXES or path.name == "CMakeLists.txt":
            yield path


def comment_of(path, line):
    """The comment text on one source line ('' when none)."""
    pattern = COMMENT.get(path.name) or COMMENT.get(path.suffix) or CPP_COMMENT
    match = pattern.search(line)
    return match.group(1) if match else ""


def names_on(tree, line):
    """Every name on one doc line, as (what, exists)."""
    text = URL.sub("", line)
    found = paths_on(tree, text)
    # Table cells and sentences ("a; b") are where a suite carries over to bare test names.
    for cell in text.split("|"):
        for clause in re.split(r";|\. ", cell):
            suite = binary = None
            bad_inputs = clause.lstrip().startswith("bad_inputs")
            for span in (s.strip() for s in CODE_SPAN.findall(clause)):
                gtest = GTEST.match(span)
                if gtest and (gtest["suite"], gtest["test"]) == ("Suite", "Test"):
                    continue  # the doc explaining its own notation
                if gtest:
                    suite, binary = gtest["suite"], gtest["binary"]
                    if binary and binary not in tree.binaries:
                        found.append(("test binary %s" % binary, False))
                    else:
                        where = " in %s" % binary if binary else ""
                        found.append(("test %s.%s%s" % (suite, gtest["test"], where),
                                      tree.test_exists(suite, gtest["test"], binary)))
                elif BARE_TEST.match(span) and bad_inputs and suite is None:
                    found.append(("bad_inputs row %s" % span, tree.row_exists(span)))
                elif BARE_TEST.match(span) and suite is not None:
                    where = " in %s" % binary if binary else ""
                    found.append(("test %s.%s%s" % (suite, span, where),
                                  tree.test_exists(suite, span, binary)))
                elif CTEST.match(span) and span.rsplit(".", 1)[1] not in FILE_EXTENSIONS and \
                        (span.split(".", 1)[0] in tree.ctest_prefixes or
                         re.fullmatch(r"np\d+", span.split(".", 1)[1])):
                    found.append(("ctest %s" % span, tree.ctest_exists(span)))
    return found


@functools.lru_cache(maxsize=None)
def anchors_of(path):
    """The anchors GitHub gives the headings of a markdown file: the heading's text (a link's
    text only) lower-cased, every character but letters, digits, '_', '-' and spaces dropped,
    spaces made '-'; a repeated anchor gets -1, -2, ..."""
    anchors, seen, in_fence = set(), {}, False
    for line in path.read_text(errors="replace").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        heading = None if in_fence else HEADING.match(line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else "%s-%d" % (slug, count))
    return frozenset(anchors)


def links_on(doc, line):
    """Every markdown link target on one doc line (code spans left out), as (what, exists):
    resolved from the doc's folder, its #anchor a heading of the target."""
    found = []
    for target in LINK.findall(CODE_SPAN.sub("", line)):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc.resolve()
        if not linked.exists():
            found.append(("link target %s" % target, False))
        elif anchor and linked.suffix == ".md":
            found.append(("link anchor %s" % target, anchor in anchors_of(linked)))
        else:
            found.append(("link target %s" % target, True))
    return found


def max_line_length(root, path):
    """The most characters a line of the doc at `path` may have (None: no limit)."""
    try:
        relative = pathlib.PurePosixPath(path.resolve().relative_to(root).as_posix())
    except ValueError:
        return None
    return MAX_LINE_LENGTH.get(relative)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=pathlib.Path)
    parser.add_argument("--ctest")
    parser.add_argument("--build-dir", type=pathlib.Path)
    parser.add_argument("--verbose", action="store_true", help="list every name checked")
    parser.add_argument("--comments", action="store_true",
                        help="also check the paths named in every source file's comments")
    parser.add_argument("docs", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    tree = Tree(args.root.resolve(), args.ctest, args.build_dir)
    failures = 0
    for doc in args.docs:
        path = doc if doc.is_absolute() else args.root / doc
        if not path.exists():
            failures += 1
            print("%s: the document does not exist" % doc)
            continue
        checked, in_fence = 0, False
        max_length = max_line_length(args.root.resolve(), path)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if max_length is not None and len(line) > max_length:
                failures += 1
                print("%s:%d: the line has %d characters, more than %d: split it (a table row "
                      "into rows, one per concern)" % (doc, number, len(line), max_length))
            links, text = [], line
            if FENCE.match(line):
                in_fence = not in_fence
            elif not in_fence:
                # Link targets are relative to the doc, not the root: checked as links only.
                links, text = links_on(path, line), LINK.sub("]()", line)
            for what, exists in links + names_on(tree, text):
                checked += 1
                if args.verbose:
                    print("%s:%d: %s %s" % (doc, number, what, "ok" if exists else "MISSING"))
                if not exists:
                    failures += 1
                    print("%s:%d: %s does not exist\n    %s" % (doc, number, what, line.strip()))
        print("%s: %d names checked" % (doc, checked))
    if args.comments:
        checked = 0
        for source in source_files(tree.root):
            for number, line in enumerate(source.read_text(errors="replace").splitlines(), 1):
                comment = URL.sub("", comment_of(source, line))
                for what, exists in paths_on(tree, comment, ours_only=True):
                    checked += 1
                    if not exists:
                        failures += 1
                        print("%s:%d: %s does not exist\n    %s" %
                              (source.relative_to(tree.root), number, what, line.strip()))
        print("source comments: %d paths checked" % checked)
    if failures:
        print("%d names in the docs do not exist or lines are too long" % failures)
        return 1
    print("every file and test the docs name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
