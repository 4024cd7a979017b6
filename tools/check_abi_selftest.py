"""Self-test of tools/check_abi.py: proves it fails on breaking edits and passes compatible ones.

Works on temporary copies only (never on include/lnmlp.h or tests/abi/): a baseline is generated
from a copy of the real header, then each case edits the copy and runs the checker on it.
Run with `python3 tools/check_abi_selftest.py`; exit 0 when every case behaves as expected. (It imports
the checker; the checker knows nothing of it.)
"""

import os
import re
import shutil
import sys
import tempfile

import check_abi

HEADER = check_abi.DEFAULT_HEADER


def _edit(text, pattern, repl):
    new, n = re.subn(pattern, repl, text, count=1, flags=re.S)
    if n != 1:  # the header changed under the test: say so instead of testing nothing
        raise AssertionError(f"self-test edit did not apply: {pattern!r}")
    return new


# (name, edit(header text) -> header text, expected exit status, text expected in the output)
CASES = [
    ("unchanged header", lambda t: t, 0, "OK"),
    ("changed signature (int64_t tokens -> int32_t)",
     lambda t: _edit(t, r"(lnmlp_desc_set_shape\(lnmlp_desc\* desc, )int64_t tokens", r"\1int32_t tokens"),
     1, "function lnmlp_desc_set_shape changed"),
    ("changed return type",
     lambda t: _edit(t, r"LNMLP_API const char\* lnmlp_last_error", "LNMLP_API char* lnmlp_last_error"),
     1, "function lnmlp_last_error changed"),
    ("changed enum value (LNMLP_DTYPE_F16 2 -> 3)",
     lambda t: _edit(t, r"LNMLP_DTYPE_F16 = 2", "LNMLP_DTYPE_F16 = 3"), 1, "enum LNMLP_DTYPE_F16 changed"),
    ("removed function",
     lambda t: _edit(t, r"LNMLP_API int32_t lnmlp_desc_set_remat\([^;]*;", ""),
     1, "function lnmlp_desc_set_remat was removed"),
    ("removed enum constant",
     lambda t: _edit(t, r"\n\s*LNMLP_QUANTIZER_COUNT = 6", ""), 1, "enum LNMLP_QUANTIZER_COUNT was removed"),
    ("added function, multi-line with comments (compatible)",
     lambda t: _edit(t, r"(#ifdef __cplusplus\n\} /\* extern)",
                     "/* new */ LNMLP_API int32_t lnmlp_new_thing(const lnmlp_plan* plan, /* out */\n"
                     "                                       int64_t*   value);\n\\1"),
     0, "+ function lnmlp_new_thing: int32_t lnmlp_new_thing(const lnmlp_plan*, int64_t*)"),
    ("added enum constant (compatible)",
     lambda t: _edit(t, r"LNMLP_DTYPE_FP8_E5M2 = 5", "LNMLP_DTYPE_FP8_E5M2 = 5,\n  LNMLP_DTYPE_FP4_E2M1 = 6"),
     0, "+ enum LNMLP_DTYPE_FP4_E2M1: 6"),
    ("spacing and comments only (same ABI)",
     lambda t: _edit(t, r"lnmlp_get_version\(int32_t\* major,", "lnmlp_get_version( int32_t * /* M */ major ,\n"),
     0, "OK: include/lnmlp.h matches"),
    ("ABI bumped with a breaking change, no new baseline",
     lambda t: _edit(_edit(t, r"(#define LNMLP_ABI_VERSION )(\d+)", lambda m: m.group(1) + str(int(m.group(2)) + 1)),
                     r"LNMLP_DTYPE_F16 = 2", "LNMLP_DTYPE_F16 = 3"),
     1, "no baseline"),
]


def main():
    failures = 0
    with open(HEADER, encoding="utf-8") as f:
        original = f.read()
    abi = check_abi.lnmlp_header.parse_header(HEADER)["abi"]
    with tempfile.TemporaryDirectory(prefix="lnmlp_abi_selftest_") as tmp:
        bdir = os.path.join(tmp, "abi")
        hdr = os.path.join(tmp, "lnmlp.h")
        shutil.copy(HEADER, hdr)
        assert check_abi.run(hdr, bdir, update=True, out=lambda s: None) == 0
        for name, edit, want_rc, want_text in CASES:
            try:
                text = edit(original)
            except AssertionError as e:
                print(f"self-test: FAIL [{name}]: {e}")
                failures += 1
                continue
            with open(hdr, "w", encoding="utf-8") as f:
                f.write(text)
            lines = []
            rc = check_abi.run(hdr, bdir, out=lines.append)
            log = "\n".join(lines)
            ok = rc == want_rc and want_text in log
            print(f"self-test: {'ok  ' if ok else 'FAIL'} [{name}] -> exit {rc}")
            if not ok:
                failures += 1
                print(f"  expected exit {want_rc} and '{want_text}' in:\n{log}")
        # After the bump, --update records lnmlp_abi_<abi+1>.txt and the same header then passes.
        rc_up = check_abi.run(hdr, bdir, update=True, out=lambda s: None)
        rc_after = check_abi.run(hdr, bdir, out=lambda s: None)
        ok = rc_up == 0 and rc_after == 0 and os.path.exists(os.path.join(bdir, f"lnmlp_abi_{abi + 1}.txt"))
        print(f"self-test: {'ok  ' if ok else 'FAIL'} [--update records the bumped ABI's baseline]")
        failures += not ok
        # ... and going back to the old ABI version is refused.
        with open(hdr, "w", encoding="utf-8") as f:
            f.write(original)
        ok = check_abi.run(hdr, bdir, out=lambda s: None) == 1
        print(f"self-test: {'ok  ' if ok else 'FAIL'} [ABI version going back is refused]")
        failures += not ok
    print(f"self-test: {'PASSED' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
