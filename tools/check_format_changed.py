#!/usr/bin/env python3
"""clang-format on the lines a change touches (Python 3 stdlib, git, clang-format).

Like `git clang-format --diff BASE`, but rename-aware: a file moved with `git mv` and edited is
checked on its edited lines only, not as a whole new file. Prints clang-format's proposed diff for
every changed range it would reformat; exit 1 if there is one.

Usage: python3 tools/check_format_changed.py [--fix] BASE FILE [FILE ...]   (non-C/C++ files are skipped)
  --fix  format those lines in place instead
"""
import difflib
import re
import subprocess
import sys


SOURCES = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")


def changed_ranges(base, files):
    out = subprocess.run(["git", "diff", "-U0", "-M", "--diff-filter=ACMR", base, "--", *files], check=True,
                         capture_output=True, text=True).stdout
    ranges, current = {}, None
    for line in out.splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else None
            continue
        m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
        if m and current:
            start, count = int(m.group(1)), int(m.group(2) or "1")
            if count > 0:
                ranges.setdefault(current, []).append((start, start + count - 1))
    return ranges


def main():
    argv = sys.argv[1:]
    fix = bool(argv) and argv[0] == "--fix"
    argv = argv[1:] if fix else argv
    if len(argv) < 2:
        print(__doc__)
        return 2
    base = argv[0]
    files = [f for f in argv[1:] if f.endswith(SOURCES)]  # clang-format formats anything as C++
    if not files:
        return 0  # (an empty path list would make git diff cover every file)
    bad = 0
    for path, spans in sorted(changed_ranges(base, files).items()):
        args = ["clang-format", "--style=file"] + [f"--lines={a}:{b}" for a, b in spans] + [path]
        formatted = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        with open(path, encoding="utf-8") as f:
            original = f.read()
        if formatted != original and fix:
            with open(path, "w", encoding="utf-8") as f:
                f.write(formatted)
        elif formatted != original:
            bad += 1
            sys.stdout.writelines(difflib.unified_diff(original.splitlines(True), formatted.splitlines(True),
                                                       "a/" + path, "b/" + path, n=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
