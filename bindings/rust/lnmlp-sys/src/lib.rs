//! Raw FFI declarations of lnmlp's whole C API, `include/lnmlp.h`: constants, opaque handles, the
//! communicator callback table and every function, with the header's comments as their docs.
//!
//! The declarations are generated, not written by hand: `tools/gen_bindings.py` writes
//! `src/lnmlp_h.rs` from the header (rerun it after changing the header; a CTest,
//! `gen_bindings.py --check`, fails when the file differs from the header). This file only
//! re-exports them.
//!
//! Every function returns an `i32` status (`LNMLP_SUCCESS` or an `LNMLP_ERROR_*` code), except
//! [`lnmlp_status_string`] and [`lnmlp_last_error`]; every enum is an `i32`, sizes are `i64`,
//! booleans are `i32` (0 or 1). See the header for the full contract of each function. The safe
//! wrapper is the `lnmlp` crate.
//!
//! # The `experimental` feature
//!
//! The header's experimental tier (declared in C only where `LNMLP_EXPERIMENTAL` is defined):
//! sharding (`lnmlp_desc_set_sharding`, the communicators, `LNMLP_FEATURE_SHARDING`), the FP8
//! state blob (`lnmlp_plan_get_state_bytes`, `_export_state`, `_import_state`) and
//! `LNMLP_BACKEND_CUDA`. It works and is tested, but may change in any release. The library
//! always exports these functions; this crate declares them only with the cargo feature
//! `experimental`.
//!
//! The library is found by this crate's build script: `LNMLP_LIB_DIR`, then `pkg-config lnmlp`,
//! then the project's CMake build trees (`build/release/src`, `build/rust-lib/src`).
#![no_std]
#![allow(non_camel_case_types)]
#![deny(missing_docs)]

// Generated: rustfmt leaves it as written (the CTest compares it byte for byte); its docs are the
// header's comments (brackets escaped: they are indices and shapes, not intra-doc links).
#[rustfmt::skip]
mod lnmlp_h;

pub use lnmlp_h::*;
