#!/usr/bin/env bash
# Builds the Java binding's jar, native libraries inside: SWIG generates the binding from lnmlp.i,
# gcc compiles its JNI glue (liblnmlp_jni.so), javac the generated and hand-written classes (java/),
# and org/lnmlp/native/linux-<arch>/ in the jar gets the glue, liblnmlp.so.2, the CUDA and MPI
# modules where the library directory has them, and every library they need that no Linux system
# is sure to have (oneDNN, the OpenMP runtime, ...), each with an rpath of $ORIGIN so that they find
# one another; NativeLoader copies them out and loads the glue. Left to the machine, as in the
# wheel: scripts/shipped-libs-lib.sh's RUN_TIME_LIBRARIES (MPI, cuBLASLt, NCCL), loaded only when a
# program asks for an MPI communicator or the CUDA backend.
#
#   bash bindings/swig/build_jar.sh LIB_DIR OUT_DIR
#
# LIB_DIR holds liblnmlp.so.2 (a CMake build's src/); everything goes under OUT_DIR, the jar as
# OUT_DIR/lnmlp-<version>.jar, whose path is printed last. Also checks that the generated Java
# covers every function and constant of lnmlp.h. Needs swig, gcc, a JDK and patchelf.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=scripts/shipped-libs-lib.sh
source "$repo/scripts/shipped-libs-lib.sh"
die() { echo "build_jar.sh: $*" >&2; exit 1; }
step() { echo "== $*" >&2; }

[[ $# == 2 ]] || die "usage: bash bindings/swig/build_jar.sh LIB_DIR OUT_DIR"
lib_dir="$(cd "$1" && pwd)"
out="$(mkdir -p "$2" && cd "$2" && pwd)"
[[ -e "$lib_dir/liblnmlp.so.2" ]] || die "no liblnmlp.so.2 in $lib_dir"
for tool in swig gcc patchelf; do
  command -v "$tool" >/dev/null || die "$tool not found (scripts/setup.sh installs it)"
done
if [[ -z "${JAVA_HOME:-}" || ! -f "${JAVA_HOME}/include/jni.h" ]]; then
  command -v javac >/dev/null || die "javac not found (Debian: apt-get install -y default-jdk-headless)"
  JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")"
fi
[[ -f "$JAVA_HOME/include/jni.h" ]] || die "no jni.h under JAVA_HOME=$JAVA_HOME"
version="$(awk '/#define LNMLP_VERSION_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END {print v}' \
  "$repo/include/lnmlp.h")"
echo "liblnmlp: $lib_dir; swig $(swig -version | sed -n 's/^SWIG Version //p'); JDK: $JAVA_HOME" >&2

# ---- generate ------------------------------------------------------------------------------------
rm -rf "$out/java" "$out/classes" "$out/lnmlp_wrap.c" "$out"/lnmlp-*.jar
mkdir -p "$out/java/org/lnmlp" "$out/classes"
step "swig -java -package org.lnmlp"
swig -java -package org.lnmlp -I"$repo/include" -outdir "$out/java/org/lnmlp" \
  -o "$out/lnmlp_wrap.c" "$here/lnmlp.i"

# Every function and enum constant of lnmlp.h must be in the generated Java, the experimental
# tier's included (lnmlp.i defines LNMLP_EXPERIMENTAL for SWIG's parse).
missing=0
for fn in $(grep -oE 'LNMLP_API [a-z0-9_ ]+\*? *lnmlp_[a-z0-9_]+\(' "$repo/include/lnmlp.h" |
            grep -oE 'lnmlp_[a-z0-9_]+'); do
  if ! grep -qE "public static .* ${fn#lnmlp_}\(" "$out/java/org/lnmlp/LnmlpNative.java"; then
    echo "missing function in LnmlpNative: $fn" >&2; missing=1
  fi
done
for c in $(grep -oE '^\s*(enum \{ *)?LNMLP_[A-Z0-9_]+ *=' "$repo/include/lnmlp.h" | grep -oE 'LNMLP_[A-Z0-9_]+') \
         LNMLP_VERSION_MAJOR LNMLP_VERSION_MINOR LNMLP_VERSION_PATCH LNMLP_ABI_VERSION; do
  if ! grep -qE "public final static int ${c#LNMLP_} = " "$out/java/org/lnmlp/LnmlpNativeConstants.java"; then
    echo "missing constant in LnmlpNativeConstants: $c" >&2; missing=1
  fi
done
# Every status-returning function says what Java returns instead of the status (lnmlp.i's
# LNMLP_RETURNS*: a failure is an exception), and every pointer has a typemap: no SWIGTYPE_p_*
# class, which would hand Java an unusable opaque pointer, but the callback table's (built in C).
for fn in $(grep -oE 'LNMLP_API int32_t lnmlp_[a-z0-9_]+' "$repo/include/lnmlp.h" | awk '{print $3}'); do
  if ! grep -qE "^LNMLP_RETURNS[A-Z_]*\(${fn}[,)]" "$here/lnmlp.i"; then
    echo "no LNMLP_RETURNS* line in lnmlp.i for $fn" >&2; missing=1
  fi
done
for f in "$out"/java/org/lnmlp/SWIGTYPE_p_*.java; do
  [[ -e "$f" && "$(basename "$f")" != SWIGTYPE_p_lnmlp_comm_callbacks.java ]] || continue
  echo "an unmapped pointer type: $(basename "$f" .java) in $(grep -l "$(basename "$f" .java)" "$out"/java/org/lnmlp/LnmlpNative.java)" >&2
  missing=1
done
[[ $missing == 0 ]] || die "the binding does not cover lnmlp.h"
echo "coverage: every lnmlp.h function and constant is in LnmlpNative / LnmlpNativeConstants, mapped" >&2

# ---- compile -------------------------------------------------------------------------------------
native="$out/classes/org/lnmlp/native/linux-$(uname -m)"
mkdir -p "$native"
step "gcc lnmlp_wrap.c -> liblnmlp_jni.so"
# shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
gcc -std=c99 -O2 -fPIC -shared -fno-strict-aliasing -Wall -Werror -Wno-unused-function \
  -I"$repo/include" -I"$JAVA_HOME/include" -I"$JAVA_HOME/include/linux" \
  "$out/lnmlp_wrap.c" -o "$native/liblnmlp_jni.so" \
  -L"$lib_dir" -llnmlp -Wl,-rpath,'$ORIGIN' -Wl,--no-undefined

step "javac"
"$JAVA_HOME/bin/javac" -Xlint:all,-try -d "$out/classes" \
  "$out"/java/org/lnmlp/*.java "$here"/java/org/lnmlp/*.java

# ---- the native libraries ------------------------------------------------------------------------
step "native libraries -> org/lnmlp/native/linux-$(uname -m)"
shipped=(liblnmlp.so.2)
for module in liblnmlp_cuda.so.1 liblnmlp_mpi.so.1; do
  [[ -e "$lib_dir/$module" ]] && shipped+=("$module")
done
for lib in "${shipped[@]}"; do cp "$(readlink -f "$lib_dir/$lib")" "$native/$lib"; done
# What the library needs from the machine beyond the system's own libraries: oneDNN and its closure.
while read -r name path; do
  [[ " ${shipped[*]} " == *" $name "* ]] && continue
  cp "$(readlink -f "$path")" "$native/$name"
  shipped+=("$name")
done < <(needed_from_machine "$lib_dir/liblnmlp.so.2")
# $ORIGIN first; the CUDA module keeps its own entries after it (where a CUDA install's cuBLASLt is).
for lib in "${shipped[@]}"; do
  rpath='$ORIGIN'
  [[ $lib == liblnmlp_cuda.so.1 ]] && rpath+=":$(patchelf --print-rpath "$native/$lib")"
  patchelf --set-rpath "${rpath%:}" "$native/$lib"
done
shipped+=(liblnmlp_jni.so)
printf '%s\n' "${shipped[@]}" > "$native/files"

# Each shipped library finds what it needs inside the jar's directory, in the system's own
# libraries, or (the modules only) in RUN_TIME_LIBRARIES.
bad=0
for lib in "${shipped[@]}"; do
  while read -r name path; do
    [[ "$path" == "$native/"* ]] && continue
    [[ " ${RUN_TIME_LIBRARIES[*]} " == *" $name "* && "$lib" == liblnmlp_*.so.1 ]] && continue
    [[ "$lib" == liblnmlp_*.so.1 ]] && ! readelf -d "$native/$lib" | grep -q "NEEDED.*\[$name\]" && continue
    echo "build_jar.sh: $lib needs $name from $path, outside the jar" >&2; bad=1
  done < <(needed_from_machine "$native/$lib")
done
[[ $bad == 0 ]] || die "the jar's native libraries are not self-contained"
echo "in the jar: ${shipped[*]}" >&2

jar="$out/lnmlp-$version.jar"
"$JAVA_HOME/bin/jar" --create --file "$jar" -C "$out/classes" .
echo "jar: $(( $(stat -c %s "$jar") / 1024 )) KiB" >&2
echo "$jar"
