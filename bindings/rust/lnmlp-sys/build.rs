//! Finds liblnmlp for linking, in this order:
//!
//! 1. `LNMLP_LIB_DIR`: a directory containing `liblnmlp.so`;
//! 2. `pkg-config lnmlp`, when a `pkg-config` binary is on the PATH (no pkg-config crate);
//! 3. the project's CMake build trees, relative to this crate: `../../../build/release/src`
//!    (the CI's build), then `../../../build/rust-lib/src` (what `bindings/rust/run_tests.sh`
//!    builds when there is no release build).
//!
//! Only a library of the ABI these declarations match is accepted: on Linux the directory must
//! hold `liblnmlp.so.2` (the SONAME; a `liblnmlp.so` of another ABI, e.g. an old build whose
//! `liblnmlp.so` points to `liblnmlp.so.1`, is refused), on macOS `liblnmlp.2.dylib`.
//!
//! Under `DOCS_RS` (docs.rs's documentation build) it looks for nothing and links nothing.
//!
//! It links `lnmlp` as a dylib, adds an rpath to the directory (so tests and binaries run
//! without `LD_LIBRARY_PATH`), and passes the directory on to dependents as `DEP_LNMLP_LIB_DIR`
//! (thanks to `links = "lnmlp"`), because Cargo applies `rustc-link-arg` only to the package
//! whose build script emitted it: the safe `lnmlp` crate re-emits the rpath for its own tests.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn target_os() -> String {
    env::var("CARGO_CFG_TARGET_OS").unwrap_or_default()
}

fn lib_file_name() -> &'static str {
    match target_os().as_str() {
        "macos" => "liblnmlp.dylib",
        "windows" => "lnmlp.lib",
        _ => "liblnmlp.so",
    }
}

/// The ABI these declarations match (`LNMLP_ABI_VERSION` in the generated src/lnmlp_h.rs; the
/// SONAME's number).
const ABI: u32 = 2;

/// The file named by the SONAME of a library of this ABI, where the platform has one.
fn abi_file_name() -> Option<String> {
    match target_os().as_str() {
        "windows" => None,
        "macos" => Some(format!("liblnmlp.{ABI}.dylib")),
        _ => Some(format!("liblnmlp.so.{ABI}")),
    }
}

fn has_lib(dir: &Path) -> bool {
    dir.join(lib_file_name()).is_file()
}

/// Whether the library in `dir` is of this ABI (its SONAME file is there).
fn has_abi(dir: &Path) -> bool {
    abi_file_name().map_or(true, |f| dir.join(f).is_file())
}

/// What a directory holding a library of another ABI has instead, for messages.
fn wrong_abi(dir: &Path) -> String {
    let real = std::fs::canonicalize(dir.join(lib_file_name())).ok();
    let real = real.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    format!(
        "{} has {}{} but no {} (a library of another ABI: these bindings need ABI {ABI})",
        dir.display(),
        lib_file_name(),
        real.map(|r| format!(" (-> {r})")).unwrap_or_default(),
        abi_file_name().unwrap_or_default()
    )
}

/// The library directories `pkg-config --libs-only-L lnmlp` reports, if pkg-config exists and
/// knows lnmlp.
fn from_pkg_config() -> Option<PathBuf> {
    let out = Command::new("pkg-config").args(["--libs-only-L", "lnmlp"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let dirs: Vec<PathBuf> =
        text.split_whitespace().filter_map(|tok| tok.strip_prefix("-L")).map(PathBuf::from).collect();
    if let Some(d) = dirs.iter().find(|d| has_lib(d)) {
        return Some(d.clone());
    }
    // pkg-config knows lnmlp but gave no -L (a system directory): ask for libdir.
    let out = Command::new("pkg-config").args(["--variable=libdir", "lnmlp"]).output().ok()?;
    let libdir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    if has_lib(&libdir) {
        Some(libdir)
    } else {
        None
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=LNMLP_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DOCS_RS");

    // docs.rs builds the documentation on a machine without liblnmlp: declarations need no
    // library to document, so nothing is linked there.
    if env::var_os("DOCS_RS").is_some() {
        return;
    }

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let mut tried: Vec<String> = Vec::new();

    let found: Option<(PathBuf, &str)> = (|| {
        if let Some(dir) = env::var_os("LNMLP_LIB_DIR") {
            let dir = PathBuf::from(dir);
            if has_lib(&dir) {
                if !has_abi(&dir) {
                    panic!(
                        "\n\nlnmlp-sys: LNMLP_LIB_DIR: {}.\nRebuild the library from this checkout, or point \
                         LNMLP_LIB_DIR at a build of it.\n",
                        wrong_abi(&dir)
                    );
                }
                return Some((dir, "LNMLP_LIB_DIR"));
            }
            // An explicit setting that is wrong is an error, not something to silently skip.
            panic!(
                "\n\nlnmlp-sys: LNMLP_LIB_DIR is set to {}, but {} is not there.\n\
                 Point LNMLP_LIB_DIR at the directory holding the built library \
                 (for a CMake build: <build dir>/src).\n",
                dir.display(),
                lib_file_name()
            );
        }
        tried.push("LNMLP_LIB_DIR (not set)".into());
        if let Some(dir) = from_pkg_config() {
            if has_abi(&dir) {
                return Some((dir, "pkg-config"));
            }
            tried.push(format!("pkg-config lnmlp: {}", wrong_abi(&dir)));
        } else {
            tried.push(
                "pkg-config lnmlp (no pkg-config binary, lnmlp.pc not found, or no library in its libdir)".into(),
            );
        }
        for rel in ["../../../build/release/src", "../../../build/rust-lib/src"] {
            let dir = manifest.join(rel);
            if has_lib(&dir) {
                let dir = dir.canonicalize().unwrap_or(dir);
                if has_abi(&dir) {
                    return Some((dir, "the CMake build tree"));
                }
                tried.push(wrong_abi(&dir));
                continue;
            }
            tried.push(format!("{}", manifest.join(rel).display()));
        }
        None
    })();

    let (dir, how) = match found {
        Some(f) => f,
        None => panic!(
            "\n\nlnmlp-sys: could not find {lib} of ABI {ABI}. Looked at:\n  - {list}\n\n\
             Build the library first, e.g. from the repository root:\n    \
             cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release && cmake --build build/release --target lnmlp\n\
             or set LNMLP_LIB_DIR to the directory containing {lib}\n\
             (bindings/rust/run_tests.sh does both for you).\n",
            lib = lib_file_name(),
            list = tried.join("\n  - ")
        ),
    };

    println!("cargo:rerun-if-changed={}", dir.join(lib_file_name()).display());
    if let Some(f) = abi_file_name() {
        println!("cargo:rerun-if-changed={}", dir.join(f).display());
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=lnmlp");
    if target_os() != "windows" {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    // Metadata for dependents (DEP_LNMLP_LIB_DIR, DEP_LNMLP_FOUND_BY).
    println!("cargo:lib_dir={}", dir.display());
    println!("cargo:found_by={how}");
}
