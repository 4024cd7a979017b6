//! Safe Rust bindings of **lnmlp**: a transformer's feed-forward sublayer as one fused,
//! differentiable unit,
//!
//! ```text
//! y = act( norm(x) @ W1 + b1 ) @ W2 + b2
//! ```
//!
//! forward and backward, in f32, bf16 or f16, optionally with FP8 GEMMs, on the CPU (host slices)
//! or, with the `experimental` feature, on a GPU (raw device pointers). It wraps the C API of
//! `include/lnmlp.h` (the raw declarations are in the `lnmlp-sys` crate).
//!
//! Shapes (row-major; T the call's tokens, H hidden, F ffn, A = 1 activation or 2 for a gated
//! pair): x, y, dx, dy `[T, H]`; gamma, beta `[H]` (no beta for RMSNorm); W1 `[H, A, F]`; b1
//! `[A, F]`; W2 `[F, H]`; b2 `[H]`. [`Plan::tensor_shape`] gives each of them as the library
//! sizes it (a sharded plan's shards included).
//!
//! Describe the block with a [`PlanBuilder`], build a [`Plan`] (validated, allocated once), then
//! run [`Plan::forward`] and [`Plan::backward`] as often as needed. [`PlanBuilder::shape`]'s
//! tokens is the most one call takes: each call takes any count from 0 to it, given by the
//! length of x (a multiple of H), and computes exactly what a plan made for that count would.
//! Failures are [`Error`]s with the library's [`Status`] and message; slice lengths are checked
//! before the library is called.
//!
//! A [`Recipe::Delayed`] plan keeps FP8 quantizer state; a caller may instead hold it, per call
//! ([`Plan::forward_with_state`], [`Plan::backward_with_state`]) or attached to the plan, which
//! then owns it ([`Plan::attach_fp8_state`]).
//!
//! Micro-batches: a call may promise that W1 and W2 are unchanged since the plan made its
//! (widened or FP8-quantized) copies of them, so it reuses those copies
//! ([`CallOptions::weights_unchanged`], [`Plan::forward_with_options`],
//! [`Plan::backward_with_options`]); and a plan may add its weight gradients into the caller's
//! buffers instead of overwriting them, optionally in f32 under bf16 / f16 I/O
//! ([`PlanBuilder::accumulate_grads`], [`PlanBuilder::grad_dtype`], [`Plan::backward_into`] with
//! [`GradientsMut`]`<T, G>`). An FP8 plan with bf16 / f16 I/O may also take fp32 master weights
//! W1 and W2 ([`PlanBuilder::weight_dtype`], [`Weights`]`<T, W>`).
//!
//! # Example
//!
//! ```
//! use lnmlp::{Activation, Norm, PlanBuilder, Weights};
//!
//! # fn main() -> Result<(), lnmlp::Error> {
//! let (t, h, f) = (4, 8, 16);
//! let mut plan = PlanBuilder::new()
//!     .shape(t, h, f)
//!     .norm(Norm::LayerNorm)
//!     .activation(Activation::Gelu)
//!     .bias(true, true)
//!     .build()?;
//!
//! let x: Vec<f32> = (0..t * h).map(|i| (i as f32 * 0.37).sin()).collect();
//! let gamma = vec![1.0f32; h];
//! let beta = vec![0.0f32; h];
//! let w1: Vec<f32> = (0..h * f).map(|i| (i as f32 * 0.11).cos() * 0.1).collect();
//! let b1 = vec![0.01f32; f];
//! let w2: Vec<f32> = (0..f * h).map(|i| (i as f32 * 0.23).sin() * 0.1).collect();
//! let b2 = vec![0.0f32; h];
//! let weights = Weights {
//!     gamma: &gamma, beta: Some(&beta), w1: &w1, b1: Some(&b1), w2: &w2, b2: Some(&b2),
//! };
//!
//! let mut y = vec![0.0f32; t * h];
//! let saved = plan.forward(&x, &weights, &mut y)?;
//!
//! let dy = vec![1.0f32; t * h]; // dL/dy for L = sum(y)
//! let grads = plan.backward(&dy, &x, &weights, &saved)?;
//! assert_eq!(grads.dw1.len(), h * f);
//! assert!(grads.db1.is_some() && grads.db2.is_some());
//!
//! // Fewer tokens in a call: x of 1 token ([1, H]), y as long.
//! let mut y1 = vec![0.0f32; h];
//! let saved1 = plan.forward(&x[..h], &weights, &mut y1)?;
//! let grads1 = plan.backward(&dy[..h], &x[..h], &weights, &saved1)?;
//! assert_eq!(grads1.dx.len(), h);
//!
//! // A wrong length is caught before the library is called: not a multiple of H, or more
//! // tokens than the plan's most.
//! let err = plan.forward(&x[..3], &weights, &mut y).unwrap_err();
//! assert_eq!(err.status(), lnmlp::Status::InvalidArgument);
//! let x5 = vec![0.0f32; 5 * h];
//! let err = plan.forward(&x5, &weights, &mut vec![0.0; 5 * h]).unwrap_err();
//! assert!(err.message().contains("at most 4 tokens per call"));
//! # Ok(())
//! # }
//! ```
//!
//! # The `experimental` feature
//!
//! The C API's experimental tier (`LNMLP_EXPERIMENTAL` in include/lnmlp.h) works and is tested,
//! but may change in any release; this crate exposes it only with the cargo feature
//! `experimental` (`lnmlp = { ..., features = ["experimental"] }`, which enables `lnmlp-sys`'s):
//!
//! - sharding: [`PlanBuilder::sharding`], [`PlanBuilder::communicator`], [`Plan::communicator`],
//!   [`Communicator`], [`Collectives`], [`CommResult`], [`Feature::Sharding`];
//! - the FP8 state as a versioned blob: [`Plan::export_state`], [`Plan::import_state`],
//!   [`Plan::state_bytes`] (without it, [`Plan::fp8_state`] and [`Plan::quantizer_state`] read
//!   the same state);
//! - the CUDA backend, [`Backend::Cuda`] (compiled and tested against a CPU emulation of CUDA,
//!   not yet run on a GPU). [`Backend`] and [`Feature`] are `#[non_exhaustive]` so that enabling
//!   the feature adds variants without breaking a `match`.
//!
//! ## Sharding
//!
//! A plan can be one rank of a tensor-parallel group (docs/sharding.md): give every rank's
//! builder [`PlanBuilder::sharding`] and a [`Communicator`] (an MPI communicator, or a Rust
//! implementation of [`Collectives`]); each rank then passes its shard of the weights (and, under
//! sequence parallelism, of the tokens), of the library's shapes ([`Plan::tensor_shape`],
//! [`Plan::w1_len`], ...). Without the feature every plan is a group of one
//! ([`Plan::group_size`] 1).
//!
//! # Finding the library
//!
//! `lnmlp-sys`'s build script links `liblnmlp.so` found through `LNMLP_LIB_DIR`, then
//! `pkg-config lnmlp`, then the project's CMake build trees (`build/release/src`,
//! `build/rust-lib/src`), and records an rpath to it. It accepts only ABI 2 (SONAME
//! `liblnmlp.so.2`, [`ffi::LNMLP_ABI_VERSION`]).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
// The docs name the experimental items, which exist only with the feature: without it they are
// plain text, not links.
#![cfg_attr(not(feature = "experimental"), allow(rustdoc::broken_intra_doc_links))]
#![allow(clippy::needless_doctest_main)]

mod buffer;
mod builder;
#[cfg(feature = "experimental")]
mod comm;
mod element;
mod error;
mod plan;
mod types;

use std::ffi::c_char;
use std::ptr;

use lnmlp_sys as sys;

pub use buffer::Saved;
pub use builder::{DescriptorBuilder, PlanBuilder};
#[cfg(feature = "experimental")]
pub use comm::{Collectives, CommResult, Communicator};
pub use element::{convert_from_f32, convert_to_f32, Bf16, Element, F16};
pub use error::{last_error, status_string, Error, Result, Status};
pub use plan::{CallOptions, Gradients, GradientsMut, Plan, QuantizerState, Weights};
pub use types::{
    Activation, Activations, AmaxAlgo, Backend, CallFlags, ClampedSwiglu, DType, DelayedScaling, ElementType, Feature,
    Fp8Encoding, Fp8Format, Norm, Quantizer, Recipe, Remat, Shape, Support, Tensor, Tokens, WeightLayout,
};

/// Re-export of the raw declarations.
pub use lnmlp_sys as ffi;

// The crate's README (its crates.io page) is compiled and run as a doc-test, so that its example
// cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

use error::check;

/// The library's release and ABI versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    /// Release major.
    pub major: i32,
    /// Release minor.
    pub minor: i32,
    /// Release patch.
    pub patch: i32,
    /// ABI version (the SONAME's number); these bindings expect [`ffi::LNMLP_ABI_VERSION`].
    pub abi: i32,
}

/// The loaded library's version (`lnmlp_get_version`).
pub fn version() -> Version {
    let mut v = Version { major: 0, minor: 0, patch: 0, abi: 0 };
    // SAFETY: four valid out-pointers.
    let rc = unsafe { sys::lnmlp_get_version(&mut v.major, &mut v.minor, &mut v.patch, &mut v.abi) };
    debug_assert_eq!(rc, sys::LNMLP_SUCCESS);
    v
}

/// A human-readable description of the loaded library's build (version, backends, GEMM library,
/// threading), for logs and bug reports.
pub fn build_info() -> &'static str {
    let mut p: *const c_char = ptr::null();
    // SAFETY: a valid out-pointer; the string is static.
    unsafe {
        if sys::lnmlp_get_build_info(&mut p) != sys::LNMLP_SUCCESS {
            return "";
        }
        error::static_str(p)
    }
}

/// Whether `backend` can run `feature` in this build on this machine, and for an FP8 recipe how:
/// natively or emulated ([`Support::is_available`] for "either").
pub fn query_support(backend: Backend, feature: Feature) -> Result<Support> {
    let mut s = 0i32;
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::lnmlp_query_support(backend.raw(), feature.raw(), &mut s) })?;
    Ok(Support::from_raw(s))
}

/// Quantizes `input` to FP8 codes: `out[i] = fp8(input[i] * scale)`, round-to-nearest-even,
/// saturating to the format's max finite value; NaN stays NaN. `scale` must be finite and
/// nonzero.
pub fn fp8_encode(format: Fp8Encoding, input: &[f32], scale: f32) -> Result<Vec<u8>> {
    let mut out = vec![0u8; input.len()];
    fp8_encode_into(format, input, scale, &mut out)?;
    Ok(out)
}

/// [`fp8_encode`] into a caller buffer of `input.len()` bytes.
pub fn fp8_encode_into(format: Fp8Encoding, input: &[f32], scale: f32, out: &mut [u8]) -> Result<()> {
    if out.len() != input.len() {
        return Err(Error::invalid(format!("out has {} bytes, but input has {} values", out.len(), input.len())));
    }
    // SAFETY: both slices hold input.len() elements and cannot overlap (& and &mut).
    check(unsafe { sys::lnmlp_fp8_encode(format.raw(), input.as_ptr(), input.len() as i64, scale, out.as_mut_ptr()) })
}

/// Dequantizes FP8 codes: `out[i] = float(input[i]) * scale_inv` (exact widening). `scale_inv`
/// must be finite and nonzero.
pub fn fp8_decode(format: Fp8Encoding, input: &[u8], scale_inv: f32) -> Result<Vec<f32>> {
    let mut out = vec![0f32; input.len()];
    fp8_decode_into(format, input, scale_inv, &mut out)?;
    Ok(out)
}

/// [`fp8_decode`] into a caller buffer of `input.len()` floats.
pub fn fp8_decode_into(format: Fp8Encoding, input: &[u8], scale_inv: f32, out: &mut [f32]) -> Result<()> {
    if out.len() != input.len() {
        return Err(Error::invalid(format!("out has {} values, but input has {} codes", out.len(), input.len())));
    }
    // SAFETY: as in fp8_encode_into.
    check(unsafe {
        sys::lnmlp_fp8_decode(format.raw(), input.as_ptr(), input.len() as i64, scale_inv, out.as_mut_ptr())
    })
}

/// A row-major `[rows, cols]` matrix quantized as TransformerEngine's NVFP4 recipe quantizes it
/// (without its random Hadamard transform and stochastic rounding; `lnmlp_nvfp4_quantize` in
/// include/lnmlp.h): FP4 E2M1 codes two to a byte (the even element in the low half),
/// `rows * ((cols + 1) / 2)` bytes; E4M3 block scales, `rows * ((cols + 15) / 16)` bytes; and the
/// amax the fp32 global scale came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4 {
    /// Rows of the matrix.
    pub rows: usize,
    /// Columns of the matrix (elements per row).
    pub cols: usize,
    /// E2M1 codes, two a byte, `rows * ((cols + 1) / 2)` bytes.
    pub codes: Vec<u8>,
    /// E4M3 block scales, `rows * ((cols + 15) / 16)` bytes (16x16 tiles: repeated on each row).
    pub scales: Vec<u8>,
    /// The amax the global scale `448 * 6 / global_amax` came from.
    pub global_amax: f32,
}

/// The bytes of a `[rows, cols]` matrix's codes and of its scales.
fn nvfp4_bytes(rows: usize, cols: usize) -> (usize, usize) {
    (rows * ((cols + 1) / 2), rows * ((cols + 15) / 16))
}

/// Quantizes `input` (`rows * cols` values) in 1x16 blocks along its rows, or in 16x16 tiles
/// (`tiles`, the recipe's weights). `global_amax`: `None` for the matrix's own largest |x| (NaN
/// if it holds one).
pub fn nvfp4_quantize(input: &[f32], rows: usize, cols: usize, tiles: bool, global_amax: Option<f32>) -> Result<Nvfp4> {
    if rows.checked_mul(cols) != Some(input.len()) {
        return Err(Error::invalid(format!("input has {} values, not {rows} x {cols}", input.len())));
    }
    let amax = global_amax.unwrap_or_else(|| {
        input.iter().fold(0f32, |m, &v| if m.is_nan() || v.is_nan() { f32::NAN } else { m.max(v.abs()) })
    });
    let (code_bytes, scale_bytes) = nvfp4_bytes(rows, cols);
    let mut q = Nvfp4 { rows, cols, codes: vec![0u8; code_bytes], scales: vec![0u8; scale_bytes], global_amax: amax };
    let block_rows = if tiles { 16 } else { 1 };
    // SAFETY: input holds rows * cols values, codes and scales the sizes the header gives.
    check(unsafe {
        sys::lnmlp_nvfp4_quantize(
            input.as_ptr(),
            rows as i64,
            cols as i64,
            block_rows,
            amax,
            q.codes.as_mut_ptr(),
            q.scales.as_mut_ptr(),
        )
    })?;
    Ok(q)
}

/// The `rows * cols` values an [`Nvfp4`]'s codes stand for: `(e2m1 * s_block) * (1 / S_enc)`.
pub fn nvfp4_dequantize(q: &Nvfp4) -> Result<Vec<f32>> {
    let n = q.rows.checked_mul(q.cols).ok_or_else(|| Error::invalid("rows * cols overflows"))?;
    if (q.codes.len(), q.scales.len()) != nvfp4_bytes(q.rows, q.cols) {
        return Err(Error::invalid(format!(
            "{} code bytes and {} scales do not fit {} x {}",
            q.codes.len(),
            q.scales.len(),
            q.rows,
            q.cols
        )));
    }
    let mut out = vec![0f32; n];
    // SAFETY: sizes checked above.
    check(unsafe {
        sys::lnmlp_nvfp4_dequantize(
            q.codes.as_ptr(),
            q.scales.as_ptr(),
            q.rows as i64,
            q.cols as i64,
            q.global_amax,
            out.as_mut_ptr(),
        )
    })?;
    Ok(out)
}
