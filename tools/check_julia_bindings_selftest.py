"""Self-test of tools/check_julia_bindings.py: proves it fails on broken Julia bindings.

Each case copies bindings/julia/LNMLP/src to a temporary directory, breaks one thing (or adds a
deliberately broken snippet file), and expects the checker to fail naming the problem; the
unmodified copy must pass. Run with `python3 tools/check_julia_bindings.py --self-test`.
"""

import os
import re
import shutil
import tempfile

import check_julia_bindings as cjb

CAPI = "capi.jl"
CONSTS = "constants.jl"


def _sub(pattern, repl):
    def edit(text):
        new, n = re.subn(pattern, repl, text, count=1)
        if n != 1:
            raise AssertionError(f"self-test edit did not apply: {pattern!r}")
        return new
    return edit


# (name, file to edit or create, edit(text) -> text, text expected in a problem; None = must pass)
CASES = [
    ("unchanged binding", None, None, None),
    ("int64_t argument declared Int32", CAPI,
     _sub(r"\(Ptr\{Cvoid\}, Int64, Int64, Int64\)", "(Ptr{Cvoid}, Int32, Int64, Int64)"),
     "lnmlp_desc_set_shape argument 2 is 'int64_t' in C, but the ccall says 'Int32'"),
    ("float argument declared Float64", CAPI,
     _sub(r"\(Ptr\{Cvoid\}, Float32\), desc, epsilon", "(Ptr{Cvoid}, Float64), desc, epsilon"),
     "lnmlp_desc_set_epsilon argument 2 is 'float'"),
    ("forward's tokens (ABI 2) declared Int32", CAPI,
     _sub(r"\(:lnmlp_plan_forward, liblnmlp\), Int32,\n\s*\(Ptr\{Cvoid\}, Int64,",
          "(:lnmlp_plan_forward, liblnmlp), Int32,\n          (Ptr{Cvoid}, Int32,"),
     "lnmlp_plan_forward argument 2 is 'int64_t' in C, but the ccall says 'Int32'"),
    ("wrong return type", CAPI,
     _sub(r"\(:lnmlp_plan_destroy, liblnmlp\), Int32", "(:lnmlp_plan_destroy, liblnmlp), Int64"),
     "lnmlp_plan_destroy returns 'int32_t' in C, but the ccall says 'Int64'"),
    ("pointer depth wrong (lnmlp_desc** as Ptr{Cvoid})", CAPI,
     _sub(r"\(Ptr\{Ptr\{Cvoid\}\},\), desc\)", "(Ptr{Cvoid},), desc)"),
     "lnmlp_desc_create argument 1 is 'lnmlp_desc**'"),
    ("argument missing", CAPI,
     _sub(r"\(Ptr\{Cvoid\}, Int32, Int32\), desc, has_bias1, has_bias2", "(Ptr{Cvoid}, Int32), desc, has_bias1"),
     "lnmlp_desc_set_bias takes 3 arguments in C, the ccall declares 2"),
    ("function not wrapped (its ccall commented out)", CAPI,
     _sub(r"(lnmlp_desc_set_remat\(desc, policy\) =\n)", r"\1    #= removed =# nothing #"),
     "lnmlp_desc_set_remat (include/lnmlp.h) has no ccall wrapper"),
    ("enum value differs", CONSTS, _sub(r"const LNMLP_DTYPE_F16 = Int32\(2\)", "const LNMLP_DTYPE_F16 = Int32(3)"),
     "constant LNMLP_DTYPE_F16 is 3 in the Julia binding, but 2 in C"),
    ("enum constant missing", CONSTS, _sub(r"const LNMLP_RECIPE_MXFP8 = Int32\(4\)\n", ""),
     "constant LNMLP_RECIPE_MXFP8 (= 4 in C) is not defined"),
    ("ABI version differs", CONSTS, _sub(r"const LNMLP_ABI_VERSION = \d+", "const LNMLP_ABI_VERSION = 99"),
     "constant LNMLP_ABI_VERSION is 99"),
    # A hand-written broken snippet in a new file, multi-line with comments, as a contributor might add it.
    ("broken snippet: unknown function, bad types", "broken.jl",
     lambda _: ('# a new wrapper, written by hand\n'
                'lnmlp_plan_run(plan, x) = ccall((:lnmlp_plan_run, liblnmlp),  # not in the header\n'
                '    Cint, (Ptr{Cvoid},\n'
                '           Ptr{Float32}), plan, x)\n'
                'bad_forward(p) = ccall((:lnmlp_plan_get_alignment, liblnmlp), Int32,\n'
                '    (Ptr{Cvoid}, #= bytes =# Ptr{Int32}), p, Ref{Int32}(0))\n'),
     "argument 2 is 'int64_t*' in C, but the ccall says 'Ptr{Int32}'"),
    ("broken snippet: a form the checker cannot verify", "broken.jl",
     lambda _: "f(p) = @ccall liblnmlp.lnmlp_plan_destroy(p::Ptr{Cvoid})::Int32\n",
     "@ccall is not checked"),
]


def main():
    failures = 0
    for name, fname, edit, want in CASES:
        with tempfile.TemporaryDirectory(prefix="lnmlp_jl_selftest_") as tmp:
            src = os.path.join(tmp, "src")
            shutil.copytree(cjb.DEFAULT_SRC, src)
            try:
                if fname:
                    path = os.path.join(src, fname)
                    old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(edit(old))
                problems = cjb.check(cjb.DEFAULT_HEADER, src)[0]
            except AssertionError as e:
                print(f"self-test: FAIL [{name}]: {e}")
                failures += 1
                continue
            ok = (not problems) if want is None else any(want in p for p in problems)
            print(f"self-test: {'ok  ' if ok else 'FAIL'} [{name}] -> {len(problems)} problem(s)"
                  + (f": {problems[0]}" if problems and ok else ""))
            if not ok:
                failures += 1
                print(f"  expected {'no problem' if want is None else repr(want)}; got:")
                for p in problems:
                    print(f"    {p}")
    print(f"self-test: {'PASSED' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0
