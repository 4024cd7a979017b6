#!/usr/bin/env python3
"""Checks the Julia binding (bindings/julia/LNMLP/src/*.jl) against include/lnmlp.h.

Julia is not available where the project is built and tested, so a wrong ccall signature would go
unnoticed until a Julia user crashed. This checker (Python 3 stdlib only) reads both sides and
fails unless:
  * every LNMLP_API function of the header is called by at least one `ccall((:name, lib), ...)`;
  * every such ccall names a function of the header, with the same number of arguments, and its
    return and argument types match the C types:
        int32_t -> Int32 / Cint        int64_t -> Int64 / Clonglong     float -> Float32 / Cfloat
        uint8_t -> UInt8               char -> UInt8 / Cchar / Int8     void / lnmlp_desc / lnmlp_plan -> Cvoid
        T*      -> Ptr{T'} or Ref{T'}  const char* -> Cstring too      (const is ignored)
  * every enum constant of the header is defined as `const NAME = value` (or `Int32(value)`) with
    the same value, and LNMLP_ABI_VERSION equals the header's;
  * no ccall uses a form it cannot check (a pointer, `@ccall`, a computed name).

Usage: python3 tools/check_julia_bindings.py [--header H] [--julia-src DIR] [--self-test]
"""

import argparse
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lnmlp_header  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_HEADER = os.path.join(ROOT, "include", "lnmlp.h")
DEFAULT_SRC = os.path.join(ROOT, "bindings", "julia", "LNMLP", "src")


# ---- Julia source reading ------------------------------------------------------------------------
def strip_julia_comments(text):
    """Removes #= =# (nestable) and # comments, keeping string literals and line numbers."""
    out, i, n, depth = [], 0, len(text), 0
    while i < n:
        c = text[i]
        if depth:
            if text.startswith("#=", i):
                depth, i = depth + 1, i + 2
            elif text.startswith("=#", i):
                depth, i = depth - 1, i + 2
            else:
                out.append("\n" if c == "\n" else " ")
                i += 1
        elif text.startswith("#=", i):
            depth, i = 1, i + 2
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == '"':  # a string: copy it whole so a '#' inside is not a comment
            q = '"""' if text.startswith('"""', i) else '"'
            j = i + len(q)
            while j < n and not text.startswith(q, j):
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + len(q)])
            i = j + len(q)
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):  # a Char literal like '#'
            m = re.match(r"'(\\.|[^\\'])'", text[i:i + 4])
            out.append(m.group(0))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _close(text, i):
    """Index just past the bracket matching the one at text[i] ( ( or { )."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = [pairs[text[i]]]
    j = i + 1
    while j < len(text) and stack:
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")}]":
            if c != stack.pop():
                raise ValueError(f"unbalanced '{c}'")
        elif c == '"':
            j = text.index('"', j + 1)
        j += 1
    if stack:
        raise ValueError("unclosed bracket")
    return j


def split_top(s):
    """Splits on commas outside brackets: 'a, Ptr{B}, (c, d)' -> ['a', 'Ptr{B}', '(c, d)']."""
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def find_ccalls(text, fname):
    """[(line, name or None, ret, [argtypes], problem or None)] for every ccall in `text`."""
    calls = []
    for m in re.finditer(r"@ccall\b", text):
        where = f"{fname}:{text.count(chr(10), 0, m.start()) + 1}"
        calls.append((where, None, None, None, "@ccall is not checked; use ccall((:name, lib), Ret, (Args...), ...)"))
    for m in re.finditer(r"(?<![@\w.])ccall\s*\(", text):
        line = text.count("\n", 0, m.start()) + 1
        where = f"{fname}:{line}"
        start = m.end() - 1
        try:
            body = text[start + 1:_close(text, start) - 1]
        except ValueError as e:
            calls.append((where, None, None, None, f"cannot read the ccall: {e}"))
            continue
        args = split_top(body)
        target = re.fullmatch(r"\(\s*:(\w+)\s*,\s*[^,]+\)", args[0]) if args else None
        if not target or len(args) < 3 or not (args[2].startswith("(") and args[2].endswith(")")):
            calls.append((where, None, None, None,
                          f"unsupported ccall form 'ccall({body[:60]}...' (want ccall((:name, lib), Ret, (Args...), ...))"))
            continue
        calls.append((where, target.group(1), args[1], split_top(args[2][1:-1]), None))
    return calls


# ---- type matching -------------------------------------------------------------------------------
_J_ALIASES = {"Cint": "Int32", "Clonglong": "Int64", "Cfloat": "Float32", "Cuchar": "UInt8",
              "Nothing": "Cvoid", "Cchar": "char", "Int8": "char"}


def julia_type(t):
    """'Ref{Cint}' -> ('ptr', 'Int32'); 'Cstring' -> ('ptr', 'char'); nested for Ptr{Ptr{..}}."""
    t = t.replace(" ", "")
    m = re.fullmatch(r"(Ptr|Ref)\{(.+)\}", t)
    if m:
        return ("ptr", julia_type(m.group(2)))
    if t == "Cstring":
        return ("ptr", "char")
    return _J_ALIASES.get(t, t)


_C_BASES = {"int32_t": "Int32", "int64_t": "Int64", "float": "Float32", "uint8_t": "UInt8",
            "char": "char", "void": "Cvoid"}


_STRUCTS = set()  # the header's struct types (set by check)


def c_type(t, opaque):
    """'const lnmlp_desc*' -> ('ptr', 'Cvoid'); 'int64_t' -> 'Int64'."""
    t = lnmlp_header.normalize_type(t)
    if t.endswith("*"):
        return ("ptr", c_type(t[:-1], opaque))
    base = " ".join(w for w in t.split() if w != "const")
    if base in opaque:
        return "Cvoid"  # an opaque handle is only ever seen through a pointer: Ptr{Cvoid}
    if base in _STRUCTS:
        return base  # a struct passed by pointer: Ref{X} of a Julia struct mirroring it
    if base not in _C_BASES:
        raise ValueError(f"no Julia mapping for the C type '{t}'")
    return _C_BASES[base]


def matches(c, j):
    if isinstance(c, tuple) or isinstance(j, tuple):
        return isinstance(c, tuple) and isinstance(j, tuple) and matches(c[1], j[1])
    return c == j or (c == "char" and j == "UInt8")  # char* as Ptr{UInt8} (bytes)


# ---- the check -----------------------------------------------------------------------------------
def julia_constants(text):
    consts = {}
    for m in re.finditer(r"^\s*const\s+(LNMLP_\w+)\s*(?:::\s*\w+\s*)?=\s*(.+?)\s*$", text, re.M):
        v = re.fullmatch(r"(?:(?:Int32|Cint|Int)\()?\s*(-?\d+)\s*\)?", m.group(2))
        consts[m.group(1)] = int(v.group(1)) if v else m.group(2)
    return consts


def _show(path):
    """A path relative to the repository when it is inside it (shorter messages)."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def check(header, src_dir):
    """List of problems (empty: the binding matches the header)."""
    info = lnmlp_header.parse_header(header)
    funcs, opaque = info["functions"], set(info["opaque"])
    _STRUCTS.clear()
    _STRUCTS.update(info.get("structs", {}))
    files = sorted(glob.glob(os.path.join(src_dir, "*.jl")))
    if not files:
        return [f"no .jl files in {src_dir}"], 0, 0, 0
    problems, calls, consts = [], [], {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            text = strip_julia_comments(fh.read())
        calls += find_ccalls(text, _show(f))
        consts.update(julia_constants(text))

    wrapped = set()
    for where, name, ret, args, problem in calls:
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        if name not in funcs:
            problems.append(f"{where}: ccall of '{name}', which include/lnmlp.h does not declare")
            continue
        wrapped.add(name)
        cret, cargs = funcs[name]
        if not matches(c_type(cret, opaque), julia_type(ret)):
            problems.append(f"{where}: {name} returns '{cret}' in C, but the ccall says '{ret}'")
        if len(args) != len(cargs):
            problems.append(f"{where}: {name} takes {len(cargs)} arguments in C, the ccall declares {len(args)}")
            continue
        for k, (ct, jt) in enumerate(zip(cargs, args)):
            if not matches(c_type(ct, opaque), julia_type(jt)):
                problems.append(f"{where}: {name} argument {k + 1} is '{ct}' in C, but the ccall says '{jt}'")
    for name in sorted(set(funcs) - wrapped):
        problems.append(f"{name} (include/lnmlp.h) has no ccall wrapper in {_show(src_dir)}")

    want = dict(info["enums"], LNMLP_ABI_VERSION=info["abi"])
    for name, value in want.items():
        if name not in consts:
            problems.append(f"constant {name} (= {value} in C) is not defined in the Julia binding")
        elif consts[name] != value:
            problems.append(f"constant {name} is {consts[name]} in the Julia binding, but {value} in C")
    return problems, len(funcs), len(calls), len(want)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--header", default=DEFAULT_HEADER)
    ap.add_argument("--julia-src", default=DEFAULT_SRC)
    ap.add_argument("--self-test", action="store_true", help="prove the checker fails on broken bindings")
    a = ap.parse_args(argv)
    if a.self_test:
        import check_julia_bindings_selftest  # tools/check_julia_bindings_selftest.py
        return check_julia_bindings_selftest.main()
    try:
        result = check(a.header, a.julia_src)
    except (lnmlp_header.HeaderError, ValueError, OSError) as e:
        print(f"check_julia_bindings: FAIL: {e}")
        return 1
    problems, nf, nc, ne = result
    if problems:
        print(f"check_julia_bindings: FAIL ({len(problems)} problems):")
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"check_julia_bindings: OK: {nf} C functions all wrapped ({nc} ccalls, types match), "
          f"{ne} constants match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
