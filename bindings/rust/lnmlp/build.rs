//! Re-emits the rpath to liblnmlp's directory (found by lnmlp-sys, passed on as
//! `DEP_LNMLP_LIB_DIR`) for this crate's own tests, examples and doc-tests: Cargo applies a
//! build script's `rustc-link-arg` only to the package that emitted it.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LNMLP_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_LNMLP_LIB_DIR") {
        if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("windows") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
