#!/usr/bin/env python3
"""The folders of src/ include only downwards (Python 3 stdlib only).

src/README.md orders the folders in layers; a file may include its own folder's headers and those
of lower layers, never a higher layer's, and the two backends (cpu/, cuda/) never each other's.
Includes are written from src/ ("plan/config.h"); a "../" include is refused outright.

Usage:
  python3 tools/check_src_layers.py [--src src]   # exit 1 and one line per offending include
  python3 tools/check_src_layers.py --self-test   # shows the checker catches an upward include
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

# Lower number = lower layer. Folders of one layer may not include each other.
LAYERS = {
    "numerics": 0,
    "common": 0,
    "comm": 1,
    "plan": 2,
    "module": 3,
    "block": 4,
    "cpu": 5,
    "cuda": 5,
    "api": 6,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def check(src):
    problems = []
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        if not os.path.isdir(path):
            continue
        if folder not in LAYERS:
            problems.append(f"{folder}/: a folder src/README.md's layers do not name (add it to tools/check_src_layers.py)")
            continue
        for root, _, files in os.walk(path):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                file = os.path.join(root, name)
                rel = os.path.relpath(file, src)
                with open(file, encoding="utf-8") as f:
                    text = f.read()
                for inc in INCLUDE.findall(text):
                    if inc.startswith("../"):
                        problems.append(f"{rel}: includes \"{inc}\"; name the folder from src/ instead")
                        continue
                    target = inc.split("/", 1)[0] if "/" in inc else None
                    if target is None or target not in LAYERS or target == folder:
                        continue  # same folder, the public header, or a system/third-party path
                    if LAYERS[target] >= LAYERS[folder]:
                        problems.append(f"{rel}: includes \"{inc}\": {target}/ is not below {folder}/")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        for folder in ("plan", "block"):
            os.makedirs(os.path.join(tmp, folder))
        with open(os.path.join(tmp, "block", "ok.h"), "w") as f:
            f.write('#include "plan/config.h"\n')
        with open(os.path.join(tmp, "plan", "bad.h"), "w") as f:
            f.write('#include "block/exec.h"\n#include "../x.h"\n')
        found = check(tmp)
        ok = len(found) == 2 and all(p.startswith("plan/bad.h") for p in found)
        print("self-test:", "ok" if ok else f"FAILED: {found}")
        return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", default="src")
    p.add_argument("--self-test", action="store_true")
    o = p.parse_args()
    if o.self_test:
        return self_test()
    problems = check(o.src)
    for line in problems:
        print(line)
    print(f"src layers: {'ok' if not problems else f'{len(problems)} upward include(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
