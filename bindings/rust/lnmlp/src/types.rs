//! The enumerations of the C API as Rust enums.

use std::fmt;
use std::str::FromStr;

use lnmlp_sys as sys;

use crate::{Error, Result};

/// The I/O element type of every tensor of a plan (`LNMLP_DTYPE_*`). GEMMs accumulate in fp32;
/// norms and activations compute in fp32 whatever the I/O type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DType {
    /// `f32`.
    #[default]
    F32,
    /// bfloat16 ([`crate::Bf16`]).
    Bf16,
    /// IEEE binary16 ([`crate::F16`]).
    F16,
}

impl DType {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            DType::F32 => sys::LNMLP_DTYPE_F32,
            DType::Bf16 => sys::LNMLP_DTYPE_BF16,
            DType::F16 => sys::LNMLP_DTYPE_F16,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
}

/// The normalization (`LNMLP_NORM_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Norm {
    /// `n = (x-mu)/sqrt(var+eps)*g + beta` (the default).
    #[default]
    LayerNorm,
    /// `n = x/sqrt(mean(x^2)+eps)*g`; no beta.
    RmsNorm,
}

impl Norm {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Norm::LayerNorm => sys::LNMLP_NORM_LAYERNORM,
            Norm::RmsNorm => sys::LNMLP_NORM_RMSNORM,
        }
    }
}

/// One activation function (`LNMLP_ACT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x`.
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// The tanh approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu,
    /// `x sigmoid(x)`.
    Silu,
    /// `x sigmoid(1.702 x)`.
    QuickGelu,
    /// `x > 0 ? x^2 : 0`.
    SquaredRelu,
    /// `sigmoid(x)`.
    Sigmoid,
    /// `a' = min(a, limit); a' sigmoid(alpha a')`; only as the pair (ClampedSilu, ClampedLinear).
    ClampedSilu,
    /// `clip(b, -limit, limit) + offset`; only as the pair (ClampedSilu, ClampedLinear).
    ClampedLinear,
}

impl Activation {
    /// Every activation, in C value order.
    pub const ALL: [Activation; 9] = [
        Activation::Linear,
        Activation::Relu,
        Activation::Gelu,
        Activation::Silu,
        Activation::QuickGelu,
        Activation::SquaredRelu,
        Activation::Sigmoid,
        Activation::ClampedSilu,
        Activation::ClampedLinear,
    ];

    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Activation::Linear => sys::LNMLP_ACT_LINEAR,
            Activation::Relu => sys::LNMLP_ACT_RELU,
            Activation::Gelu => sys::LNMLP_ACT_GELU,
            Activation::Silu => sys::LNMLP_ACT_SILU,
            Activation::QuickGelu => sys::LNMLP_ACT_QUICK_GELU,
            Activation::SquaredRelu => sys::LNMLP_ACT_SQUARED_RELU,
            Activation::Sigmoid => sys::LNMLP_ACT_SIGMOID,
            Activation::ClampedSilu => sys::LNMLP_ACT_CLAMPED_SILU,
            Activation::ClampedLinear => sys::LNMLP_ACT_CLAMPED_LINEAR,
        }
    }

    /// The name ("gelu", "quick_gelu", ...), as the Python binding spells it.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Linear => "linear",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Silu => "silu",
            Activation::QuickGelu => "quick_gelu",
            Activation::SquaredRelu => "squared_relu",
            Activation::Sigmoid => "sigmoid",
            Activation::ClampedSilu => "clamped_silu",
            Activation::ClampedLinear => "clamped_linear",
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The activation list of a plan: one function, or a gated pair `a = f0(h0) * f1(h1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activations {
    /// `a = f(h)`; A = 1.
    Single(Activation),
    /// `a = f0(h[:,0,:]) * f1(h[:,1,:])`; A = 2.
    Gated(Activation, Activation),
}

impl Default for Activations {
    /// `relu`, the library's default.
    fn default() -> Self {
        Activations::Single(Activation::Relu)
    }
}

/// The gated pairs users ask for by name.
const GATED_PAIRS: [(&str, Activation, Activation); 7] = [
    ("geglu", Activation::Gelu, Activation::Linear),
    ("swiglu", Activation::Silu, Activation::Linear),
    ("reglu", Activation::Relu, Activation::Linear),
    ("qgeglu", Activation::QuickGelu, Activation::Linear),
    ("sreglu", Activation::SquaredRelu, Activation::Linear),
    ("glu", Activation::Sigmoid, Activation::Linear),
    ("clamped_swiglu", Activation::ClampedSilu, Activation::ClampedLinear),
];

impl Activations {
    /// Parses a single activation ("gelu"), a gated pair's name ("swiglu", "geglu", "reglu",
    /// "qgeglu", "sreglu", "glu", "clamped_swiglu") or two names separated by a comma
    /// ("silu,linear"). Case-insensitive; '-' is accepted for '_'.
    pub fn from_name(name: &str) -> Result<Activations> {
        let norm: String = name.trim().to_ascii_lowercase().replace('-', "_");
        let parts: Vec<&str> = norm.split(',').map(str::trim).collect();
        let one = |s: &str| -> Result<Activation> {
            Activation::ALL.iter().copied().find(|a| a.name() == s).ok_or_else(|| {
                let known: Vec<&str> = Activation::ALL.iter().map(|a| a.name()).collect();
                let pairs: Vec<&str> = GATED_PAIRS.iter().map(|p| p.0).collect();
                Error::invalid(format!(
                    "unknown activation {s:?} in {name:?}; known: {} and the pairs {}",
                    known.join(", "),
                    pairs.join(", ")
                ))
            })
        };
        match parts.as_slice() {
            [single] => {
                if let Some(&(_, a, b)) = GATED_PAIRS.iter().find(|p| p.0 == *single) {
                    Ok(Activations::Gated(a, b))
                } else {
                    Ok(Activations::Single(one(single)?))
                }
            }
            [a, b] => Ok(Activations::Gated(one(a)?, one(b)?)),
            _ => Err(Error::invalid(format!("an activation list has 1 or 2 entries, got {} in {name:?}", parts.len()))),
        }
    }

    /// A, the number of activation functions (1 or 2): W1 is `[H, A, F]`, b1 `[A, F]`.
    pub fn count(self) -> usize {
        match self {
            Activations::Single(_) => 1,
            Activations::Gated(..) => 2,
        }
    }

    pub(crate) fn raw(self) -> Vec<i32> {
        match self {
            Activations::Single(a) => vec![a.raw()],
            Activations::Gated(a, b) => vec![a.raw(), b.raw()],
        }
    }
}

impl FromStr for Activations {
    type Err = Error;
    fn from_str(s: &str) -> Result<Activations> {
        Activations::from_name(s)
    }
}

impl From<Activation> for Activations {
    fn from(a: Activation) -> Activations {
        Activations::Single(a)
    }
}

/// Parameters of the clamped SwiGLU pair (ClampedSilu, ClampedLinear):
/// `a' = min(a, limit); out = a' sigmoid(alpha a') * (clip(b, -limit, limit) + offset)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClampedSwiglu {
    /// `limit > 0`, finite (default 7).
    pub limit: f32,
    /// Finite (default 1.702).
    pub alpha: f32,
    /// Finite (default 1).
    pub offset: f32,
}

impl Default for ClampedSwiglu {
    fn default() -> Self {
        ClampedSwiglu { limit: 7.0, alpha: 1.702, offset: 1.0 }
    }
}

/// What forward saves for backward (`LNMLP_REMAT_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Remat {
    /// Statistics, norm output, GEMM1 output and activation output (the default).
    #[default]
    SaveAll,
    /// Statistics and the GEMM1 output ("ffn1"); backward recomputes the elementwise parts.
    SaveFfn1,
    /// Only the norm statistics; backward recomputes GEMM1 too.
    SaveStats,
    /// Nothing; backward is refused. For inference.
    ForwardOnly,
}

impl Remat {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Remat::SaveAll => sys::LNMLP_REMAT_SAVE_ALL,
            Remat::SaveFfn1 => sys::LNMLP_REMAT_SAVE_FFN1,
            Remat::SaveStats => sys::LNMLP_REMAT_SAVE_STATS,
            Remat::ForwardOnly => sys::LNMLP_REMAT_FORWARD_ONLY,
        }
    }
}

/// How W1 and W2 (and dW1, dW2) are laid out (`LNMLP_WEIGHT_LAYOUT_*`,
/// [`crate::PlanBuilder::weight_layout`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// W1 `[H, A, F]`, W2 `[F, H]`: input features by output features, as JAX kernels (the
    /// default).
    #[default]
    InOut,
    /// W1 `[A, F, H]`, W2 `[H, F]`: output features by input features, as PyTorch's `nn.Linear`
    /// weights.
    OutIn,
}

impl WeightLayout {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            WeightLayout::InOut => sys::LNMLP_WEIGHT_LAYOUT_IN_OUT,
            WeightLayout::OutIn => sys::LNMLP_WEIGHT_LAYOUT_OUT_IN,
        }
    }
}

/// Where a plan runs (`LNMLP_BACKEND_*`). Non-exhaustive: [`Backend::Cuda`] exists only with the
/// `experimental` feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The embedded CPU backend: host memory (the default).
    #[default]
    Cpu,
    /// Experimental (feature `experimental`; compiled and tested against a CPU emulation of CUDA,
    /// not yet run on a GPU): the CUDA backend, device memory, through
    /// [`crate::Plan::forward_raw`] / [`crate::Plan::backward_raw`].
    #[cfg(feature = "experimental")]
    Cuda,
}

impl Backend {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Backend::Cpu => sys::LNMLP_BACKEND_CPU,
            #[cfg(feature = "experimental")]
            Backend::Cuda => sys::LNMLP_BACKEND_CUDA,
        }
    }
}

/// FP8 recipes (`LNMLP_RECIPE_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Recipe {
    /// No quantization (the default).
    #[default]
    None,
    /// Per-tensor scales from an amax history kept in the plan (stateful).
    Delayed,
    /// Per-tensor scales from the tensor's own amax (stateless).
    Current,
    /// 1x128 blocks for activations/gradients, 128x128 tiles for weights.
    Block,
    /// 1x32 blocks, E8M0 scales.
    Mxfp8,
    /// FP4 E2M1 in 1x16 blocks with E4M3 scales and a global scale, 16x16 weight tiles, the
    /// random Hadamard transform and stochastic rounding ([`crate::PlanBuilder::nvfp4_options`]);
    /// the CUDA backend emulates its FP4 GEMMs.
    Nvfp4,
}

impl Recipe {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Recipe::None => sys::LNMLP_RECIPE_NONE,
            Recipe::Delayed => sys::LNMLP_RECIPE_DELAYED,
            Recipe::Current => sys::LNMLP_RECIPE_CURRENT,
            Recipe::Block => sys::LNMLP_RECIPE_BLOCK,
            Recipe::Mxfp8 => sys::LNMLP_RECIPE_MXFP8,
            Recipe::Nvfp4 => sys::LNMLP_RECIPE_NVFP4,
        }
    }
}

/// Which FP8 formats the quantizers use (`LNMLP_FP8_FORMAT_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// The recipe's default: Hybrid for Delayed and Current, E4M3 for Block and Mxfp8.
    #[default]
    Default,
    /// E4M3 for forward tensors, E5M2 for gradients.
    Hybrid,
    /// E4M3 for all six quantizers.
    E4M3,
}

impl Fp8Format {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Fp8Format::Default => sys::LNMLP_FP8_FORMAT_DEFAULT,
            Fp8Format::Hybrid => sys::LNMLP_FP8_FORMAT_HYBRID,
            Fp8Format::E4M3 => sys::LNMLP_FP8_FORMAT_E4M3,
        }
    }
}

/// How delayed scaling reduces the amax history (`LNMLP_AMAX_ALGO_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AmaxAlgo {
    /// The largest entry of the whole history (default).
    #[default]
    Max,
    /// The newest entry.
    MostRecent,
}

impl AmaxAlgo {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            AmaxAlgo::Max => sys::LNMLP_AMAX_ALGO_MAX,
            AmaxAlgo::MostRecent => sys::LNMLP_AMAX_ALGO_MOST_RECENT,
        }
    }
}

/// Delayed scaling's options (TransformerEngine's `DelayedScaling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DelayedScaling {
    /// `scale = (fmt_max / amax) / 2^margin`; in [-126, 127]. Default 0.
    pub margin: i32,
    /// Entries of each quantizer's amax history, 1 ..= 65536. Default 1024.
    pub amax_history_len: usize,
    /// How the history is reduced. Default [`AmaxAlgo::Max`].
    pub amax_compute_algo: AmaxAlgo,
}

impl Default for DelayedScaling {
    fn default() -> Self {
        DelayedScaling { margin: 0, amax_history_len: 1024, amax_compute_algo: AmaxAlgo::Max }
    }
}

/// The six FP8 quantizers (`LNMLP_QUANTIZER_*`), named after the data they quantize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quantizer {
    /// Norm output, GEMM1's input (forward).
    LnOut,
    /// W1 (forward).
    W1,
    /// Activation output, GEMM2's input (forward).
    ActOut,
    /// W2 (forward).
    W2,
    /// Gradient of the output (backward).
    Dy,
    /// Gradient of GEMM1's output, after the activation's derivative (backward).
    Dh,
}

impl Quantizer {
    /// All six, in C value order.
    pub const ALL: [Quantizer; 6] =
        [Quantizer::LnOut, Quantizer::W1, Quantizer::ActOut, Quantizer::W2, Quantizer::Dy, Quantizer::Dh];

    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Quantizer::LnOut => sys::LNMLP_QUANTIZER_LN_OUT,
            Quantizer::W1 => sys::LNMLP_QUANTIZER_W1,
            Quantizer::ActOut => sys::LNMLP_QUANTIZER_ACT_OUT,
            Quantizer::W2 => sys::LNMLP_QUANTIZER_W2,
            Quantizer::Dy => sys::LNMLP_QUANTIZER_DY,
            Quantizer::Dh => sys::LNMLP_QUANTIZER_DH,
        }
    }
}

/// FP8 element types (`LNMLP_DTYPE_FP8_E4M3`, `LNMLP_DTYPE_FP8_E5M2`), for [`crate::fp8_encode`] /
/// [`crate::fp8_decode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Encoding {
    /// OCP "e4m3fn": max 448, no infinities.
    E4M3,
    /// E5M2: max 57344, with infinities.
    E5M2,
}

impl Fp8Encoding {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Fp8Encoding::E4M3 => sys::LNMLP_DTYPE_FP8_E4M3,
            Fp8Encoding::E5M2 => sys::LNMLP_DTYPE_FP8_E5M2,
        }
    }

    /// The largest finite value (448 or 57344).
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Encoding::E4M3 => 448.0,
            Fp8Encoding::E5M2 => 57344.0,
        }
    }
}

/// Features for [`crate::query_support`] (`LNMLP_FEATURE_*`). Non-exhaustive:
/// [`Feature::Sharding`] exists only with the `experimental` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// The backend is compiled in and usable on this machine.
    Backend,
    /// f32 I/O.
    DTypeF32,
    /// bf16 I/O.
    DTypeBf16,
    /// f16 I/O.
    DTypeF16,
    /// The Delayed recipe.
    RecipeDelayed,
    /// The Current recipe.
    RecipeCurrent,
    /// The Block recipe.
    RecipeBlock,
    /// The Mxfp8 recipe.
    RecipeMxfp8,
    /// Experimental (feature `experimental`): tensor-parallel sharding.
    #[cfg(feature = "experimental")]
    Sharding,
    /// Caller-attached workspace.
    ExternalWorkspace,
    /// The Nvfp4 recipe.
    RecipeNvfp4,
}

impl Feature {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Feature::Backend => sys::LNMLP_FEATURE_BACKEND,
            Feature::DTypeF32 => sys::LNMLP_FEATURE_DTYPE_F32,
            Feature::DTypeBf16 => sys::LNMLP_FEATURE_DTYPE_BF16,
            Feature::DTypeF16 => sys::LNMLP_FEATURE_DTYPE_F16,
            Feature::RecipeDelayed => sys::LNMLP_FEATURE_RECIPE_DELAYED,
            Feature::RecipeCurrent => sys::LNMLP_FEATURE_RECIPE_CURRENT,
            Feature::RecipeBlock => sys::LNMLP_FEATURE_RECIPE_BLOCK,
            Feature::RecipeMxfp8 => sys::LNMLP_FEATURE_RECIPE_MXFP8,
            #[cfg(feature = "experimental")]
            Feature::Sharding => sys::LNMLP_FEATURE_SHARDING,
            Feature::ExternalWorkspace => sys::LNMLP_FEATURE_EXTERNAL_WORKSPACE,
            Feature::RecipeNvfp4 => sys::LNMLP_FEATURE_RECIPE_NVFP4,
        }
    }
}

/// [`crate::query_support`]'s answer (`LNMLP_UNSUPPORTED`, `LNMLP_SUPPORTED`,
/// `LNMLP_SUPPORTED_EMULATED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Support {
    /// The backend cannot run the feature in this build on this machine.
    Unsupported,
    /// It can; for an FP8 recipe, on FP8 tensor cores.
    Supported,
    /// An FP8 recipe whose quantized GEMMs are emulated exactly (codes decoded and multiplied in
    /// bf16/fp32 with fp32 accumulation: the values FP8 hardware gives, up to the order of sums),
    /// slower: the CPU backend for every recipe, the CUDA backend for some.
    Emulated,
}

impl Support {
    /// Whether a plan with the feature can be made: [`Support::Supported`] or [`Support::Emulated`].
    pub fn is_available(self) -> bool {
        self != Support::Unsupported
    }

    pub(crate) fn from_raw(v: i32) -> Support {
        match v {
            sys::LNMLP_SUPPORTED => Support::Supported,
            sys::LNMLP_SUPPORTED_EMULATED => Support::Emulated,
            _ => Support::Unsupported,
        }
    }
}

/// The tensors of forward and backward (`LNMLP_TENSOR_*`), for [`crate::Plan::tensor_shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tensor {
    /// x, `[T, H]` (T: the call's tokens).
    X,
    /// gamma, `[H]`.
    Gamma,
    /// beta, `[H]`; not taken by RMSNorm plans.
    Beta,
    /// W1, `[H, A, F]` (`[H, A, F/P]` for a rank of a sharded group).
    W1,
    /// b1, `[A, F]`; not taken when disabled.
    B1,
    /// W2, `[F, H]`.
    W2,
    /// b2, `[H]`; not taken when disabled.
    B2,
    /// y, `[T, H]`.
    Y,
    /// The saved buffer, bytes ([`ElementType::U8`]); not taken by [`crate::Remat::ForwardOnly`].
    Saved,
    /// dy, `[T, H]`.
    Dy,
    /// dx, `[T, H]`.
    Dx,
    /// dgamma, `[H]`.
    DGamma,
    /// dbeta, `[H]`; not taken by RMSNorm plans.
    DBeta,
    /// dW1, as W1.
    DW1,
    /// db1, as b1.
    DB1,
    /// dW2, as W2.
    DW2,
    /// db2, as b2.
    DB2,
    /// The FP8 quantizer state, f32 `[6, 1 + amax history length]`; only [`Recipe::Delayed`]
    /// plans have it.
    Fp8State,
}

impl Tensor {
    /// All of them, in C value order.
    pub const ALL: [Tensor; 18] = [
        Tensor::X,
        Tensor::Gamma,
        Tensor::Beta,
        Tensor::W1,
        Tensor::B1,
        Tensor::W2,
        Tensor::B2,
        Tensor::Y,
        Tensor::Saved,
        Tensor::Dy,
        Tensor::Dx,
        Tensor::DGamma,
        Tensor::DBeta,
        Tensor::DW1,
        Tensor::DB1,
        Tensor::DW2,
        Tensor::DB2,
        Tensor::Fp8State,
    ];

    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            Tensor::X => sys::LNMLP_TENSOR_X,
            Tensor::Gamma => sys::LNMLP_TENSOR_GAMMA,
            Tensor::Beta => sys::LNMLP_TENSOR_BETA,
            Tensor::W1 => sys::LNMLP_TENSOR_W1,
            Tensor::B1 => sys::LNMLP_TENSOR_B1,
            Tensor::W2 => sys::LNMLP_TENSOR_W2,
            Tensor::B2 => sys::LNMLP_TENSOR_B2,
            Tensor::Y => sys::LNMLP_TENSOR_Y,
            Tensor::Saved => sys::LNMLP_TENSOR_SAVED,
            Tensor::Dy => sys::LNMLP_TENSOR_DY,
            Tensor::Dx => sys::LNMLP_TENSOR_DX,
            Tensor::DGamma => sys::LNMLP_TENSOR_DGAMMA,
            Tensor::DBeta => sys::LNMLP_TENSOR_DBETA,
            Tensor::DW1 => sys::LNMLP_TENSOR_DW1,
            Tensor::DB1 => sys::LNMLP_TENSOR_DB1,
            Tensor::DW2 => sys::LNMLP_TENSOR_DW2,
            Tensor::DB2 => sys::LNMLP_TENSOR_DB2,
            Tensor::Fp8State => sys::LNMLP_TENSOR_FP8_STATE,
        }
    }

    /// The argument's name in this crate (`"x"`, `"w1"`, `"dgamma"`, `"saved"`, `"fp8_state"`),
    /// as error messages use it.
    pub fn name(self) -> &'static str {
        match self {
            Tensor::X => "x",
            Tensor::Gamma => "gamma",
            Tensor::Beta => "beta",
            Tensor::W1 => "w1",
            Tensor::B1 => "b1",
            Tensor::W2 => "w2",
            Tensor::B2 => "b2",
            Tensor::Y => "y",
            Tensor::Saved => "saved",
            Tensor::Dy => "dy",
            Tensor::Dx => "dx",
            Tensor::DGamma => "dgamma",
            Tensor::DBeta => "dbeta",
            Tensor::DW1 => "dw1",
            Tensor::DB1 => "db1",
            Tensor::DW2 => "dw2",
            Tensor::DB2 => "db2",
            Tensor::Fp8State => "fp8_state",
        }
    }

    /// Its index in [`Tensor::ALL`].
    pub(crate) fn index(self) -> usize {
        self.raw() as usize
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element type of a [`Shape`] (the plan's I/O types, and bytes for the saved buffer) and of
/// a collective's buffer (`LNMLP_DTYPE_*`: F32, BF16, F16, U8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// `f32` (the FP8 state, and f32 plans' tensors).
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
    /// Bytes (the saved buffer; FP8 codes in a collective).
    U8,
}

impl ElementType {
    /// The C value.
    pub fn raw(self) -> i32 {
        match self {
            ElementType::F32 => sys::LNMLP_DTYPE_F32,
            ElementType::Bf16 => sys::LNMLP_DTYPE_BF16,
            ElementType::F16 => sys::LNMLP_DTYPE_F16,
            ElementType::U8 => sys::LNMLP_DTYPE_U8,
        }
    }

    /// The type of a C value; `None` for a value this crate does not know.
    pub fn from_raw(raw: i32) -> Option<ElementType> {
        match raw {
            sys::LNMLP_DTYPE_F32 => Some(ElementType::F32),
            sys::LNMLP_DTYPE_BF16 => Some(ElementType::Bf16),
            sys::LNMLP_DTYPE_F16 => Some(ElementType::F16),
            sys::LNMLP_DTYPE_U8 => Some(ElementType::U8),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElementType::F32 => 4,
            ElementType::Bf16 | ElementType::F16 => 2,
            ElementType::U8 => 1,
        }
    }
}

impl From<DType> for ElementType {
    fn from(d: DType) -> ElementType {
        match d {
            DType::F32 => ElementType::F32,
            DType::Bf16 => ElementType::Bf16,
            DType::F16 => ElementType::F16,
        }
    }
}

/// The shape of one tensor of a call, as the library reports it
/// (`lnmlp_plan_get_tensor_shape`): up to [`Shape::MAX_RANK`] dimensions and an element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    rank: usize,
    dims: [usize; sys::LNMLP_MAX_TENSOR_RANK],
    element_type: ElementType,
}

impl Shape {
    /// The most dimensions a shape has (W1's `[H, A, F]`).
    pub const MAX_RANK: usize = sys::LNMLP_MAX_TENSOR_RANK;

    pub(crate) fn new(dims: &[usize], element_type: ElementType) -> Shape {
        let mut d = [0; sys::LNMLP_MAX_TENSOR_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Shape { rank: dims.len(), dims: d, element_type }
    }

    /// The dimensions, outermost first (row-major).
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of elements (the product of the dimensions).
    pub fn len(&self) -> usize {
        self.dims().iter().product()
    }

    /// Whether it has no elements (x, y, dx, dy of a call with 0 tokens).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.element_type.size()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The token count a shape is asked for ([`crate::Plan::tensor_shape`]): a count from 0 to the
/// plan's most, or the plan's most itself (`LNMLP_TOKENS_MAX`). A `usize` converts into
/// [`Tokens::Count`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tokens {
    /// The plan's most tokens per call (its [`crate::Plan::max_tokens`]).
    Max,
    /// That many tokens (0 ..= the plan's most).
    Count(usize),
}

impl From<usize> for Tokens {
    fn from(t: usize) -> Tokens {
        Tokens::Count(t)
    }
}

/// Flags of a forward or backward call (`LNMLP_CALL_*`), OR'ed with `|`; for the raw calls
/// ([`crate::Plan::forward_raw`], [`crate::Plan::backward_raw`]). The
/// slice-taking calls take them as [`crate::CallOptions`].
///
/// ```
/// use lnmlp::CallFlags;
/// let f = CallFlags::DEFAULT | CallFlags::WEIGHTS_UNCHANGED;
/// assert!(f.contains(CallFlags::WEIGHTS_UNCHANGED));
/// assert_eq!(f.raw(), lnmlp::ffi::LNMLP_CALL_WEIGHTS_UNCHANGED);
/// assert_eq!(CallFlags::default(), CallFlags::DEFAULT);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CallFlags(i32);

impl CallFlags {
    /// No flag (`LNMLP_CALL_DEFAULT`).
    pub const DEFAULT: CallFlags = CallFlags(sys::LNMLP_CALL_DEFAULT);
    /// `LNMLP_CALL_WEIGHTS_UNCHANGED`: W1 and W2 hold the values they had when the plan last made
    /// its copies of them; the call reuses those copies (see
    /// [`crate::CallOptions::weights_unchanged`]).
    pub const WEIGHTS_UNCHANGED: CallFlags = CallFlags(sys::LNMLP_CALL_WEIGHTS_UNCHANGED);

    /// The C value.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// Whether every flag of `other` is set in `self`.
    pub fn contains(self, other: CallFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for CallFlags {
    type Output = CallFlags;
    fn bitor(self, rhs: CallFlags) -> CallFlags {
        CallFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for CallFlags {
    fn bitor_assign(&mut self, rhs: CallFlags) {
        self.0 |= rhs.0;
    }
}
