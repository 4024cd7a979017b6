#!/usr/bin/env bash
# Generates the Java (JNI) binding of lnmlp with SWIG, builds it, and runs bindings/swig/test.
#
#   bash bindings/swig/run_tests.sh
#
# Needs: swig (Debian: apt-get install swig), a JDK (javac, java; JAVA_HOME or javac on PATH),
# gcc, and liblnmlp: $LNMLP_LIB_DIR if set, else build/release/src if it holds liblnmlp.so, else
# a CPU-only build made here (cmake). Every output goes under build/swig/.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="${LNMLP_SWIG_OUT:-$REPO/build/swig}"
START=$(date +%s.%N)

die() { echo "run_tests.sh: $*" >&2; exit 1; }
step() { echo "== $*"; }

command -v swig >/dev/null || die "swig not found (Debian/Ubuntu: apt-get install -y swig)"
command -v gcc >/dev/null || die "gcc not found"
if [[ -z "${JAVA_HOME:-}" || ! -f "${JAVA_HOME}/include/jni.h" ]]; then
  command -v javac >/dev/null || die "javac not found (Debian: apt-get install -y default-jdk-headless)"
  JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")"
fi
[[ -f "$JAVA_HOME/include/jni.h" ]] || die "no jni.h under JAVA_HOME=$JAVA_HOME"
JAVAC="$JAVA_HOME/bin/javac"
JAVA="$JAVA_HOME/bin/java"
[[ -x "$JAVA" ]] || JAVA="$(command -v java)" || die "java not found"

# ---- liblnmlp ------------------------------------------------------------------------------------
if [[ -n "${LNMLP_LIB_DIR:-}" ]]; then
  LIB_DIR="$(cd "$LNMLP_LIB_DIR" && pwd)"
elif [[ -e "$REPO/build/release/src/liblnmlp.so" ]]; then
  LIB_DIR="$REPO/build/release/src"
else
  step "building liblnmlp (CPU only) in $OUT/lnmlp-build"
  command -v cmake >/dev/null || die "cmake not found, and no LNMLP_LIB_DIR / build/release/src"
  cmake -S "$REPO" -B "$OUT/lnmlp-build" -DCMAKE_BUILD_TYPE=Release -DLNMLP_BUILD_TESTS=OFF \
    -DLNMLP_BUILD_BENCH=OFF -DLNMLP_CUDA=OFF >/dev/null
  cmake --build "$OUT/lnmlp-build" -j"$(nproc)" --target lnmlp >/dev/null
  LIB_DIR="$OUT/lnmlp-build/src"
fi
[[ -e "$LIB_DIR/liblnmlp.so" ]] || die "no liblnmlp.so in $LIB_DIR"
echo "liblnmlp: $LIB_DIR"
echo "swig: $(swig -version | sed -n 's/^SWIG Version //p'), JDK: $JAVA_HOME"

# ---- generate ------------------------------------------------------------------------------------
rm -rf "$OUT/java" "$OUT/classes" "$OUT/lnmlp_wrap.c" "$OUT/liblnmlp_jni.so"
mkdir -p "$OUT/java/org/lnmlp" "$OUT/classes"
step "swig -java -package org.lnmlp"
swig -java -package org.lnmlp -I"$REPO/include" -outdir "$OUT/java/org/lnmlp" \
  -o "$OUT/lnmlp_wrap.c" "$HERE/lnmlp.i"

# Every function and enum constant of lnmlp.h must be in the generated Java, the experimental
# tier's included (lnmlp.i defines LNMLP_EXPERIMENTAL for SWIG's parse).
missing=0
for fn in $(grep -oE 'LNMLP_API [a-z0-9_ ]+\*? *lnmlp_[a-z0-9_]+\(' "$REPO/include/lnmlp.h" |
            grep -oE 'lnmlp_[a-z0-9_]+'); do
  if ! grep -qE "public static .* ${fn#lnmlp_}\(" "$OUT/java/org/lnmlp/LnmlpNative.java"; then
    echo "missing function in LnmlpNative: $fn" >&2; missing=1
  fi
done
for c in $(grep -oE '^\s*(enum \{ *)?LNMLP_[A-Z0-9_]+ *=' "$REPO/include/lnmlp.h" | grep -oE 'LNMLP_[A-Z0-9_]+') \
         LNMLP_VERSION_MAJOR LNMLP_VERSION_MINOR LNMLP_VERSION_PATCH LNMLP_ABI_VERSION; do
  if ! grep -qE "public final static int ${c#LNMLP_} = " "$OUT/java/org/lnmlp/LnmlpNativeConstants.java"; then
    echo "missing constant in LnmlpNativeConstants: $c" >&2; missing=1
  fi
done
[[ $missing == 0 ]] || die "the binding does not cover lnmlp.h"
echo "coverage: every lnmlp.h function and constant is in LnmlpNative / LnmlpNativeConstants"

# ---- compile -------------------------------------------------------------------------------------
step "gcc lnmlp_wrap.c -> liblnmlp_jni.so"
gcc -std=c99 -O2 -fPIC -shared -fno-strict-aliasing -Wall -Wno-unused-function \
  -I"$REPO/include" -I"$JAVA_HOME/include" -I"$JAVA_HOME/include/linux" \
  "$OUT/lnmlp_wrap.c" -o "$OUT/liblnmlp_jni.so" \
  -L"$LIB_DIR" -llnmlp -Wl,-rpath,"$LIB_DIR" -Wl,--no-undefined

step "javac"
"$JAVAC" -Xlint:all,-try -d "$OUT/classes" \
  "$OUT"/java/org/lnmlp/*.java "$HERE"/java/org/lnmlp/*.java "$HERE/test/LnmlpTest.java"

# ---- run -----------------------------------------------------------------------------------------
step "java LnmlpTest"
set +e
"$JAVA" -Xcheck:jni -ea -Dlnmlp.jni.path="$OUT/liblnmlp_jni.so" -cp "$OUT/classes" LnmlpTest \
  2>&1 | tee "$OUT/test.log"
rc=${PIPESTATUS[0]}
set -e
[[ $rc == 0 ]] || die "LnmlpTest failed (exit $rc)"
if grep -q "WARNING in native method" "$OUT/test.log"; then
  die "-Xcheck:jni reported misuse of JNI (see $OUT/test.log)"
fi
awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN { printf "run_tests.sh: passed in %.1f s\n", e - s }'
