#!/usr/bin/env python3
"""The CPU backend's ISA levels share no code (Python 3 stdlib + binutils' nm).

src/cpu/cpu_exec.cpp is compiled once per x86-64 ISA level (src/cpu/isa.h). If two levels'
objects both defined the same function (an inline function or a template instantiation outside the
level's own inline namespace), the linker would keep one copy for both, and the baseline level
could run an AVX-512 copy on a CPU without AVX-512. This checks that no code symbol is defined by
more than one level's object.

Usage:
  python3 tools/check_cpu_levels.py OBJECT.o OBJECT.o [...]   # one object per level
  python3 tools/check_cpu_levels.py --self-test
"""

import subprocess
import sys
import tempfile
import os


def code_symbols(obj):
    out = subprocess.run(["nm", "--defined-only", obj], check=True, capture_output=True, text=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        # Global and weak code: what the linker can hand from one object to another. Local symbols
        # (t, such as each object's static initializers) are the object's own.
        if len(parts) == 3 and parts[1] in "TW":
            syms.add(parts[2])
    return syms


def demangle(names):
    try:
        return subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                              text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def check(objects):
    seen = {}
    shared = {}
    for obj in objects:
        for s in code_symbols(obj):
            if s in seen:
                shared.setdefault(s, [seen[s]]).append(obj)
            else:
                seen[s] = obj
    return shared


def self_test():
    """Two objects that both emit the same inline function must be reported."""
    with tempfile.TemporaryDirectory() as tmp:
        objs = []
        for name in ("one", "two"):
            src, obj = os.path.join(tmp, name + ".cpp"), os.path.join(tmp, name + ".o")
            with open(src, "w") as f:  # taking its address makes each object emit `shared`
                f.write("inline int shared(int x) { return x * 3; }\nint (*p_%s)(int) = shared;\n" % name)
            subprocess.run(["g++", "-c", "-O0", src, "-o", obj], check=True)
            objs.append(obj)
        found = demangle(list(check(objs)))
        ok = any(d.startswith("shared(") for d in found)
        print("self-test:", "ok" if ok else f"FAILED: {found}")
        return 0 if ok else 1


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    if len(args) < 2:
        print("cpu levels: one level only; nothing to compare")
        return 0
    shared = check(args)
    names = demangle(sorted(shared))
    for mangled, name in zip(sorted(shared), names):
        print(f"defined by more than one level: {name}")
    print(f"cpu levels: {'ok, no shared code' if not shared else f'{len(shared)} shared code symbol(s)'} "
          f"({len(args)} levels)")
    return 1 if shared else 0


if __name__ == "__main__":
    sys.exit(main())
