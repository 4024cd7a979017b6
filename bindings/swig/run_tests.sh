#!/usr/bin/env bash
# Builds the Java (JNI) binding's jar (build_jar.sh: SWIG, the JNI glue, the classes and the native
# libraries inside), and runs bindings/swig/test from that jar, with the machine's oneDNN hidden
# from the loader where a private mount namespace can be made, then checks that every lnmlp, oneDNN
# and OpenMP library the test mapped came out of the jar.
#
#   bash bindings/swig/run_tests.sh
#
# Needs: swig (Debian: apt-get install swig), patchelf, a JDK (javac, java; JAVA_HOME or javac on PATH),
# gcc, and liblnmlp: $LNMLP_LIB_DIR if set, else build/release/src if it holds liblnmlp.so, else
# a CPU-only build made here (cmake). Every output goes under build/swig/.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="${LNMLP_SWIG_OUT:-$REPO/build/swig}"
START=$(date +%s.%N)

die() { echo "run_tests.sh: $*" >&2; exit 1; }
step() { echo "== $*"; }

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

# ---- build ---------------------------------------------------------------------------------------
jar="$(bash "$HERE/build_jar.sh" "$LIB_DIR" "$OUT")"
step "javac LnmlpTest against $(basename "$jar")"
rm -rf "$OUT/test-classes"
"$JAVAC" -Xlint:all,-try -cp "$jar" -d "$OUT/test-classes" "$HERE/test/LnmlpTest.java"

# ---- run -----------------------------------------------------------------------------------------
# The test runs on the natives inside the jar, the machine's oneDNN hidden where it can be.
# shellcheck source=scripts/shipped-libs-lib.sh
source "$REPO/scripts/shipped-libs-lib.sh"
step "java LnmlpTest, from the jar"
hide_system_onednn "run_tests.sh: "
set +e
(cd "$OUT" && env -u LD_LIBRARY_PATH "${HIDE_ONEDNN[@]}" \
  "$JAVA" -Xcheck:jni -ea -cp "$jar:$OUT/test-classes" LnmlpTest) 2>&1 | tee "$OUT/test.log"
rc=${PIPESTATUS[0]}
set -e
[[ $rc == 0 ]] || die "LnmlpTest failed (exit $rc)"
if grep -q "WARNING in native method" "$OUT/test.log"; then
  die "-Xcheck:jni reported misuse of JNI (see $OUT/test.log)"
fi
# Every lnmlp, oneDNN and OpenMP library the test mapped is one the jar carried: all in the one
# directory NativeLoader copied them to, next to the glue.
natives="$(sed -n 's/^native library: //p' "$OUT/test.log")"
dir="$(dirname "$(grep '/liblnmlp_jni\.so$' <<<"$natives")")"
[[ "$dir" != . && "$dir" != "$OUT"* ]] || die "the glue was not loaded from a copy out of the jar"
grep -q '/libdnnl' <<<"$natives" || die "no oneDNN among the mapped libraries"
outside="$(grep -v "^$dir/" <<<"$natives" || true)"
[[ -z "$outside" ]] || die "loaded from outside the jar: $outside"
echo "run_tests.sh: lnmlp, oneDNN and OpenMP all came out of the jar ($dir)"
awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN { printf "run_tests.sh: passed in %.1f s\n", e - s }'
