#!/usr/bin/env bash
# Builds (if needed) and tests the Rust bindings: cargo build of the core alone (no features, so
# that it compiles without the experimental tier), cargo test and cargo doc (warnings are errors)
# with --all-features, cargo clippy -D warnings with and without features, and cargo fmt --check
# (these two if installed), all offline; then the documentation as docs.rs builds it (DOCS_RS set,
# no library linked) and `cargo package` of both crates, which builds and tests-compiles them from
# the packaged files alone, as crates.io would get them. Cargo's output goes to build/rust-target.
#
# The library: $LNMLP_LIB_DIR if set; else build/release/src if the CI already built it there;
# else a CPU-only build of our own in build/rust-lib.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
start=$(date +%s)

if [[ -z "${LNMLP_LIB_DIR:-}" ]]; then
  if [[ -f "$root/build/release/src/liblnmlp.so" ]]; then
    export LNMLP_LIB_DIR="$root/build/release/src"
  else
    echo "== building liblnmlp in build/rust-lib"
    cmake -S "$root" -B "$root/build/rust-lib" -DCMAKE_BUILD_TYPE=Release -DLNMLP_BUILD_TESTS=OFF \
      -DLNMLP_BUILD_BENCH=OFF -DLNMLP_CUDA=OFF >/dev/null
    cmake --build "$root/build/rust-lib" -j"${JOBS:-2}" --target lnmlp
    export LNMLP_LIB_DIR="$root/build/rust-lib/src"
  fi
fi
echo "== using liblnmlp from $LNMLP_LIB_DIR"

# rustup installs cargo in ~/.cargo/bin, which a non-login shell may not have on its PATH.
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null || { echo "run_tests.sh: cargo not found (install Rust: rustup)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/build/rust-target}"
cd "$here"

echo "== cargo build (no features: the core without the experimental tier)"
cargo build --offline --locked --workspace

echo "== cargo test --all-features"
cargo test --offline --locked --workspace --all-features

echo "== cargo doc --all-features"
RUSTDOCFLAGS="-Dwarnings" cargo doc --offline --locked --no-deps --workspace --all-features

if cargo clippy --version >/dev/null 2>&1; then
  echo "== cargo clippy (no features)"
  cargo clippy --offline --locked --workspace --all-targets -- -D warnings
  echo "== cargo clippy --all-features"
  cargo clippy --offline --locked --workspace --all-targets --all-features -- -D warnings
else
  echo "== cargo clippy: not installed, skipped"
fi

if cargo fmt --version >/dev/null 2>&1; then
  echo "== cargo fmt --check"
  cargo fmt --all --check
else
  echo "== cargo fmt: not installed, skipped"
fi

echo "== cargo doc as docs.rs builds it (DOCS_RS: no library to link)"
DOCS_RS=1 RUSTDOCFLAGS="-Dwarnings" CARGO_TARGET_DIR="$CARGO_TARGET_DIR/docs-rs" \
  cargo doc --offline --locked --no-deps --workspace --all-features

# --allow-dirty: what is checked is the packaged files, not whether the checkout is committed.
# A fresh CARGO_HOME each time: to verify lnmlp against the packaged lnmlp-sys, cargo extracts
# lnmlp-sys into CARGO_HOME/registry/src and reuses an extracted copy of the same name and version,
# so a change to lnmlp-sys's files without a version bump was verified against the old files (a
# new sys function "not found"). Neither crate has a dependency to fetch, so nothing is lost.
echo "== cargo package (both crates, built from their packaged files)"
package_home="$CARGO_TARGET_DIR/package-cargo-home"
rm -rf "$package_home"
CARGO_HOME="$package_home" cargo package --offline --locked --workspace --allow-dirty

echo "== rust bindings: all passed in $(( $(date +%s) - start ))s"
