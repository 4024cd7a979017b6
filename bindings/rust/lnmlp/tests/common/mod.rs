//! Shared by the integration tests: a small deterministic RNG and an independent float64
//! reference of the block, written with plain loops (no code shared with the library).
#![allow(dead_code, clippy::needless_range_loop)]

/// Tolerances, all in one place, as max|lib - ref| <= TOL * max|ref| (per tensor):
/// - f32: the library computes in fp32 with fp32 accumulation; for these small shapes (sums of
///   at most ~64 terms) the error is a few ulps of the largest value, ~1e-6 relative to the
///   tensor's max. 1e-5 leaves a 10x margin.
/// - bf16: 8-bit significands, unit roundoff 2^-9. Inputs are rounded to bf16 for both sides,
///   but the library also rounds its intermediates (norm output, GEMM1 output, activation) and
///   its outputs to bf16; 3-5 such roundings per output, amplified a little by the activation's
///   derivative, stay below 2^-5 ~ 3e-2 of the tensor's max (the C++ tests use the same).
/// - f16: 11-bit significands, 8x tighter than bf16: 4e-3.
pub const TOL_F32: f64 = 1e-5;
pub const TOL_BF16: f64 = 3e-2;
pub const TOL_F16: f64 = 4e-3;

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Linear,
    Gelu,
    Silu,
}

#[derive(Clone, Debug)]
pub struct Cfg {
    pub t: usize,
    pub h: usize,
    pub f: usize,
    pub rms: bool,
    pub zero_centered: bool,
    pub eps: f64,
    pub acts: Vec<Act>,
    pub bias1: bool,
    pub bias2: bool,
}

impl Cfg {
    pub fn a(&self) -> usize {
        self.acts.len()
    }
}

#[derive(Clone, Debug)]
pub struct Params {
    pub gamma: Vec<f64>,
    pub beta: Vec<f64>,
    pub w1: Vec<f64>,
    pub b1: Vec<f64>,
    pub w2: Vec<f64>,
    pub b2: Vec<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct Grads {
    pub dx: Vec<f64>,
    pub dgamma: Vec<f64>,
    pub dbeta: Vec<f64>,
    pub dw1: Vec<f64>,
    pub db1: Vec<f64>,
    pub dw2: Vec<f64>,
    pub db2: Vec<f64>,
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)

fn act(a: Act, v: f64) -> f64 {
    match a {
        Act::Linear => v,
        Act::Gelu => 0.5 * v * (1.0 + (GELU_C * (v + 0.044715 * v * v * v)).tanh()),
        Act::Silu => v / (1.0 + (-v).exp()),
    }
}

fn dact(a: Act, v: f64) -> f64 {
    match a {
        Act::Linear => 1.0,
        Act::Gelu => {
            let t = (GELU_C * (v + 0.044715 * v * v * v)).tanh();
            0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * v * v)
        }
        Act::Silu => {
            let s = 1.0 / (1.0 + (-v).exp());
            s * (1.0 + v * (1.0 - s))
        }
    }
}

/// Intermediates of forward: xhat [T,H], rs [T], n [T,H], h [T,A,F], a [T,F], y [T,H].
pub struct Fwd {
    pub xhat: Vec<f64>,
    pub rs: Vec<f64>,
    pub n: Vec<f64>,
    pub hh: Vec<f64>,
    pub a: Vec<f64>,
    pub y: Vec<f64>,
}

pub fn forward(c: &Cfg, x: &[f64], p: &Params) -> Fwd {
    let (t, h, f, na) = (c.t, c.h, c.f, c.a());
    let mut xhat = vec![0.0; t * h];
    let mut rs = vec![0.0; t];
    let mut n = vec![0.0; t * h];
    for r in 0..t {
        let row = &x[r * h..(r + 1) * h];
        let mu = if c.rms { 0.0 } else { row.iter().sum::<f64>() / h as f64 };
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / h as f64;
        rs[r] = 1.0 / (var + c.eps).sqrt();
        for k in 0..h {
            let g = p.gamma[k] + if c.zero_centered { 1.0 } else { 0.0 };
            xhat[r * h + k] = (row[k] - mu) * rs[r];
            n[r * h + k] = xhat[r * h + k] * g + if c.rms { 0.0 } else { p.beta[k] };
        }
    }
    let mut hh = vec![0.0; t * na * f];
    for r in 0..t {
        for j in 0..na * f {
            let mut s = if c.bias1 { p.b1[j] } else { 0.0 };
            for k in 0..h {
                s += n[r * h + k] * p.w1[k * na * f + j];
            }
            hh[r * na * f + j] = s;
        }
    }
    let mut a = vec![0.0; t * f];
    for r in 0..t {
        for j in 0..f {
            let h0 = hh[r * na * f + j];
            a[r * f + j] =
                if na == 1 { act(c.acts[0], h0) } else { act(c.acts[0], h0) * act(c.acts[1], hh[r * na * f + f + j]) };
        }
    }
    let mut y = vec![0.0; t * h];
    for r in 0..t {
        for k in 0..h {
            let mut s = if c.bias2 { p.b2[k] } else { 0.0 };
            for j in 0..f {
                s += a[r * f + j] * p.w2[j * h + k];
            }
            y[r * h + k] = s;
        }
    }
    Fwd { xhat, rs, n, hh, a, y }
}

/// Gradients of L = sum(y * dy).
pub fn backward(c: &Cfg, x: &[f64], p: &Params, dy: &[f64]) -> Grads {
    let (t, h, f, na) = (c.t, c.h, c.f, c.a());
    let fw = forward(c, x, p);
    let mut g = Grads {
        dx: vec![0.0; t * h],
        dgamma: vec![0.0; h],
        dbeta: vec![0.0; h],
        dw1: vec![0.0; h * na * f],
        db1: vec![0.0; na * f],
        dw2: vec![0.0; f * h],
        db2: vec![0.0; h],
    };
    // GEMM2
    for r in 0..t {
        for k in 0..h {
            g.db2[k] += dy[r * h + k];
            for j in 0..f {
                g.dw2[j * h + k] += fw.a[r * f + j] * dy[r * h + k];
            }
        }
    }
    // activation
    let mut dh = vec![0.0; t * na * f];
    for r in 0..t {
        for j in 0..f {
            let mut da = 0.0;
            for k in 0..h {
                da += dy[r * h + k] * p.w2[j * h + k];
            }
            let h0 = fw.hh[r * na * f + j];
            if na == 1 {
                dh[r * f + j] = da * dact(c.acts[0], h0);
            } else {
                let h1 = fw.hh[r * na * f + f + j];
                dh[r * na * f + j] = da * dact(c.acts[0], h0) * act(c.acts[1], h1);
                dh[r * na * f + f + j] = da * act(c.acts[0], h0) * dact(c.acts[1], h1);
            }
        }
    }
    // GEMM1
    let mut dn = vec![0.0; t * h];
    for r in 0..t {
        for j in 0..na * f {
            let d = dh[r * na * f + j];
            g.db1[j] += d;
            for k in 0..h {
                g.dw1[k * na * f + j] += fw.n[r * h + k] * d;
                dn[r * h + k] += d * p.w1[k * na * f + j];
            }
        }
    }
    // norm
    for r in 0..t {
        let mut m1 = 0.0;
        let mut m2 = 0.0;
        let mut dxhat = vec![0.0; h];
        for k in 0..h {
            let gk = p.gamma[k] + if c.zero_centered { 1.0 } else { 0.0 };
            g.dgamma[k] += dn[r * h + k] * fw.xhat[r * h + k];
            g.dbeta[k] += dn[r * h + k];
            dxhat[k] = dn[r * h + k] * gk;
            m1 += dxhat[k] / h as f64;
            m2 += dxhat[k] * fw.xhat[r * h + k] / h as f64;
        }
        for k in 0..h {
            let centered = if c.rms { 0.0 } else { m1 };
            g.dx[r * h + k] = fw.rs[r] * (dxhat[k] - centered - fw.xhat[r * h + k] * m2);
        }
    }
    g
}

/// Asserts max|got - want| <= tol * max|want| (with a floor so an all-zero tensor passes).
pub fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{name}[{i}] = {g} is not finite");
        let d = (g - w).abs();
        if d > worst {
            worst = d;
            at = i;
        }
    }
    assert!(
        worst <= tol * scale,
        "{name}: max |got - want| = {worst:e} at [{at}] (got {}, want {}) > {tol:e} * max|want| ({scale:e})",
        got[at],
        want[at]
    );
}

/// The inputs of `tokens` tokens and the parameters of a block [H] -> [A, F] -> [H], drawn from
/// `seed` in one order (x, dy, gamma around 1, beta, w1, b1, w2, b2) and made values of `T` by
/// `make`; a call with t tokens takes the first t rows of x and dy.
pub struct Problem<T> {
    pub x: Vec<T>,
    pub dy: Vec<T>,
    pub gamma: Vec<T>,
    pub beta: Vec<T>,
    pub w1: Vec<T>,
    pub b1: Vec<T>,
    pub w2: Vec<T>,
    pub b2: Vec<T>,
}

impl<T> Problem<T> {
    pub fn draw(seed: u64, tokens: usize, h: usize, f: usize, a: usize, make: impl Fn(f64) -> T) -> Problem<T> {
        let mut r = Rng::new(seed);
        let mut v = |n: usize, scale: f64, offset: f64| -> Vec<T> {
            r.vec(n, scale).into_iter().map(|x| make(x + offset)).collect()
        };
        Problem {
            x: v(tokens * h, 2.0, 0.0),
            dy: v(tokens * h, 1.0, 0.0),
            gamma: v(h, 0.5, 1.0),
            beta: v(h, 0.2, 0.0),
            w1: v(h * a * f, 1.0 / (h as f64).sqrt(), 0.0),
            b1: v(a * f, 0.2, 0.0),
            w2: v(f * h, 1.0 / (f as f64).sqrt(), 0.0),
            b2: v(h, 0.2, 0.0),
        }
    }
}

impl<T: lnmlp::Element> Problem<T> {
    /// [`Problem::draw`] with each value rounded to `T` (through f32).
    pub fn random(seed: u64, tokens: usize, h: usize, f: usize, a: usize) -> Problem<T> {
        Problem::draw(seed, tokens, h, f, a, |x| T::from_f32(x as f32))
    }

    /// The parameters as the library takes them: beta only for LayerNorm, each bias where enabled.
    pub fn weights(&self, layer_norm: bool, bias: (bool, bool)) -> lnmlp::Weights<'_, T> {
        lnmlp::Weights {
            gamma: &self.gamma,
            beta: layer_norm.then_some(&self.beta[..]),
            w1: &self.w1,
            b1: bias.0.then_some(&self.b1[..]),
            w2: &self.w2,
            b2: bias.1.then_some(&self.b2[..]),
        }
    }

    /// The parameters' exact values, for the float64 reference.
    pub fn params(&self) -> Params {
        Params {
            gamma: f64s(&self.gamma),
            beta: f64s(&self.beta),
            w1: f64s(&self.w1),
            b1: f64s(&self.b1),
            w2: f64s(&self.w2),
            b2: f64s(&self.b2),
        }
    }
}

/// The exact values of library elements.
pub fn f64s<T: lnmlp::Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// `forward_raw` on host memory: x's tokens with p's gamma, beta and biases and the given w1 and
/// w2, into a new y and a new saved buffer sized for the call; returns (y, saved).
pub fn forward_raw_on_host(
    plan: &mut lnmlp::Plan,
    x: &[f32],
    p: &Problem<f32>,
    w1: &[f32],
    w2: &[f32],
    flags: lnmlp::CallFlags,
) -> (Vec<f32>, lnmlp::Saved) {
    let t = x.len() / plan.hidden();
    let mut y = vec![0.0f32; x.len()];
    let mut saved = plan.new_saved_for(t).unwrap();
    let c = |v: &[f32]| v.as_ptr() as *const std::ffi::c_void;
    // SAFETY: host slices of the call's sizes (t rows of x and y; the parameters of the plan's
    // shapes: the callers' plans have LayerNorm and both biases), saved sized and aligned for
    // the call, y and saved exclusively borrowed; no FP8 state, no stream.
    unsafe {
        plan.forward_raw(
            t,
            c(x),
            c(&p.gamma),
            c(&p.beta),
            c(w1),
            c(&p.b1),
            c(w2),
            c(&p.b2),
            y.as_mut_ptr() as *mut _,
            saved.as_mut_bytes().as_mut_ptr() as *mut _,
            std::ptr::null_mut(),
            flags,
            std::ptr::null_mut(),
        )
    }
    .unwrap();
    (y, saved)
}

/// A single-threaded plan of LayerNorm (epsilon 1e-5), gelu and both biases, for at most
/// `max_tokens` tokens per call: the block most tests take, before their own settings.
pub fn layernorm_gelu(max_tokens: usize, h: usize, f: usize) -> lnmlp::PlanBuilder {
    lnmlp::PlanBuilder::new()
        .shape(max_tokens, h, f)
        .norm(lnmlp::Norm::LayerNorm)
        .epsilon(1e-5)
        .activation(lnmlp::Activation::Gelu)
        .bias(true, true)
        .num_threads(1)
}
