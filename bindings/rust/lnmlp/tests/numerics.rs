//! Forward and every gradient against the float64 reference in `common`.
mod common;

use common::*;
use lnmlp::{Activation, Bf16, Element, Norm, Plan, PlanBuilder, Remat, Tensor, Tokens, WeightLayout, Weights, F16};

struct Case {
    cfg: Cfg,
    x: Vec<f64>,
    p: Params,
    dy: Vec<f64>,
}

fn case(cfg: Cfg, seed: u64) -> Case {
    let mut r = Rng::new(seed);
    let (t, h, f, a) = (cfg.t, cfg.h, cfg.f, cfg.a());
    let x = r.vec(t * h, 2.0);
    let p = Params {
        gamma: r.vec(h, 0.5).iter().map(|v| v + if cfg.zero_centered { 0.0 } else { 1.0 }).collect(),
        beta: r.vec(h, 0.2),
        w1: r.vec(h * a * f, 1.0 / (h as f64).sqrt()),
        b1: r.vec(a * f, 0.2),
        w2: r.vec(f * h, 1.0 / (f as f64).sqrt()),
        b2: r.vec(h, 0.2),
    };
    let dy = r.vec(t * h, 1.0);
    Case { cfg, x, p, dy }
}

/// Rounds every tensor of a case to T, so the reference sees exactly the library's inputs.
fn rounded<T: Element>(v: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = v.iter().map(|&x| T::from_f32(x as f32)).collect();
    let back = t.iter().map(|x| x.to_f32() as f64).collect();
    (t, back)
}

fn to_f64<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// A row-major [rows, cols] matrix transposed into [cols, rows].
fn transposed<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..cols * rows).map(|i| v[(i % rows) * cols + i / rows]).collect()
}

fn run<T: Element>(c: &Case, remat: Remat, tol: f64) {
    run_in_layout::<T>(c, remat, tol, WeightLayout::InOut);
}

/// The case with its weights in `layout` (the reference's are in x out: W1 [H, A*F], W2 [F, H]).
fn run_in_layout<T: Element>(c: &Case, remat: Remat, tol: f64, layout: WeightLayout) {
    let cfg = &c.cfg;
    let (af, h, f) = (cfg.a() * cfg.f, cfg.h, cfg.f);
    let out_in = layout == WeightLayout::OutIn;
    let (x, xr) = rounded::<T>(&c.x);
    let (gamma, gr) = rounded::<T>(&c.p.gamma);
    let (beta, br) = rounded::<T>(&c.p.beta);
    let (mut w1, w1r) = rounded::<T>(&c.p.w1);
    let (b1, b1r) = rounded::<T>(&c.p.b1);
    let (mut w2, w2r) = rounded::<T>(&c.p.w2);
    if out_in {
        w1 = transposed(&w1, h, af);
        w2 = transposed(&w2, f, h);
    }
    let (b2, b2r) = rounded::<T>(&c.p.b2);
    let (dy, dyr) = rounded::<T>(&c.dy);
    let pr = Params { gamma: gr, beta: br, w1: w1r, b1: b1r, w2: w2r, b2: b2r };

    let acts: Vec<Activation> = cfg
        .acts
        .iter()
        .map(|a| match a {
            Act::Linear => Activation::Linear,
            Act::Gelu => Activation::Gelu,
            Act::Silu => Activation::Silu,
        })
        .collect();
    let mut b = PlanBuilder::new()
        .shape(cfg.t, cfg.h, cfg.f)
        .norm(if cfg.rms { Norm::RmsNorm } else { Norm::LayerNorm })
        .zero_centered_gamma(cfg.zero_centered)
        .epsilon(cfg.eps as f32)
        .bias(cfg.bias1, cfg.bias2)
        .element::<T>()
        .remat(remat)
        .weight_layout(layout)
        .num_threads(2);
    b = if acts.len() == 2 && acts == [Activation::Silu, Activation::Linear] {
        b.activation_name("swiglu") // the gated pair by name
    } else if acts.len() == 2 {
        b.gated(acts[0], acts[1])
    } else {
        b.activation(acts[0])
    };
    let mut plan: Plan = b.build().expect("plan");
    assert_eq!(plan.num_activations(), cfg.a());
    assert_eq!(plan.weight_layout(), layout);
    let w1_dims = if out_in { vec![cfg.a(), f, h] } else { vec![h, cfg.a(), f] };
    assert_eq!(plan.tensor_shape(Tensor::W1, Tokens::Max).unwrap().unwrap().dims(), &w1_dims[..]);
    assert_eq!(plan.local_ffn(), f);

    let w = Weights {
        gamma: &gamma,
        beta: (!cfg.rms).then_some(&beta[..]),
        w1: &w1,
        b1: cfg.bias1.then_some(&b1[..]),
        w2: &w2,
        b2: cfg.bias2.then_some(&b2[..]),
    };
    let mut y = vec![T::default(); cfg.t * cfg.h];
    let saved = plan.forward(&x, &w, &mut y).expect("forward");
    assert_eq!(saved.len(), plan.saved_bytes());
    assert_eq!(saved.as_bytes().as_ptr() as usize % plan.alignment(), 0);

    let want = forward(cfg, &xr, &pr);
    assert_close("y", &to_f64(&y), &want.y, tol);

    let g = plan.backward(&dy, &x, &w, &saved).expect("backward");
    let r = backward(cfg, &xr, &pr, &dyr);
    assert_close("dx", &to_f64(&g.dx), &r.dx, tol);
    assert_close("dgamma", &to_f64(&g.dgamma), &r.dgamma, tol);
    assert_eq!(g.dbeta.is_some(), !cfg.rms);
    if let Some(d) = &g.dbeta {
        assert_close("dbeta", &to_f64(d), &r.dbeta, tol);
    }
    let (dw1, dw2) =
        if out_in { (transposed(&g.dw1, af, h), transposed(&g.dw2, h, f)) } else { (g.dw1.clone(), g.dw2.clone()) };
    assert_close("dw1", &to_f64(&dw1), &r.dw1, tol);
    assert_eq!(g.db1.is_some(), cfg.bias1);
    if let Some(d) = &g.db1 {
        assert_close("db1", &to_f64(d), &r.db1, tol);
    }
    assert_close("dw2", &to_f64(&dw2), &r.dw2, tol);
    assert_eq!(g.db2.is_some(), cfg.bias2);
    if let Some(d) = &g.db2 {
        assert_close("db2", &to_f64(d), &r.db2, tol);
    }

    // backward_into with reused buffers gives the same gradients
    let mut g2 = g.clone();
    for v in g2.dx.iter_mut().chain(g2.dw1.iter_mut()) {
        *v = T::from_f32(123.0);
    }
    plan.backward_into(&dy, &x, &w, &saved, g2.as_mut()).expect("backward_into");
    assert!(g2 == g, "backward_into differs from backward");
}

fn ln_gelu() -> Cfg {
    Cfg {
        t: 6,
        h: 16,
        f: 24,
        rms: false,
        zero_centered: false,
        eps: 1e-5,
        acts: vec![Act::Gelu],
        bias1: true,
        bias2: true,
    }
}

fn rms_swiglu() -> Cfg {
    Cfg {
        t: 5,
        h: 12,
        f: 20,
        rms: true,
        zero_centered: true,
        eps: 1e-6,
        acts: vec![Act::Silu, Act::Linear],
        bias1: true,
        bias2: false,
    }
}

#[test]
fn f32_layernorm_gelu_with_biases() {
    run::<f32>(&case(ln_gelu(), 1), Remat::SaveAll, TOL_F32);
}

#[test]
fn f32_rmsnorm_swiglu_zero_centered() {
    run::<f32>(&case(rms_swiglu(), 2), Remat::SaveAll, TOL_F32);
}

#[test]
fn f32_every_remat_policy() {
    for remat in [Remat::SaveFfn1, Remat::SaveStats] {
        run::<f32>(&case(ln_gelu(), 3), remat, TOL_F32);
        run::<f32>(&case(rms_swiglu(), 4), remat, TOL_F32);
    }
}

#[test]
fn bf16_layernorm_gelu_and_swiglu() {
    run::<Bf16>(&case(ln_gelu(), 5), Remat::SaveAll, TOL_BF16);
    run::<Bf16>(&case(rms_swiglu(), 6), Remat::SaveAll, TOL_BF16);
}

#[test]
fn f16_layernorm_gelu() {
    run::<F16>(&case(ln_gelu(), 7), Remat::SaveAll, TOL_F16);
}

#[test]
fn out_in_weights_every_dtype() {
    // PyTorch's layout: W1 [A, F, H], W2 [H, F], and dW1, dW2 alike.
    run_in_layout::<f32>(&case(ln_gelu(), 9), Remat::SaveAll, TOL_F32, WeightLayout::OutIn);
    run_in_layout::<f32>(&case(rms_swiglu(), 10), Remat::SaveStats, TOL_F32, WeightLayout::OutIn);
    run_in_layout::<Bf16>(&case(rms_swiglu(), 11), Remat::SaveAll, TOL_BF16, WeightLayout::OutIn);
    run_in_layout::<F16>(&case(ln_gelu(), 12), Remat::SaveAll, TOL_F16, WeightLayout::OutIn);
}

#[test]
fn forward_only_saves_nothing_and_refuses_backward() {
    let c = case(ln_gelu(), 8);
    let cfg = &c.cfg;
    let mut plan = PlanBuilder::new()
        .shape(cfg.t, cfg.h, cfg.f)
        .activation(Activation::Gelu)
        .bias(true, true)
        .epsilon(cfg.eps as f32)
        .remat(Remat::ForwardOnly)
        .build()
        .unwrap();
    assert_eq!(plan.saved_bytes(), 0);
    let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let (x, gamma, beta, w1, b1, w2, b2) =
        (f(&c.x), f(&c.p.gamma), f(&c.p.beta), f(&c.p.w1), f(&c.p.b1), f(&c.p.w2), f(&c.p.b2));
    let w = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: Some(&b1), w2: &w2, b2: Some(&b2) };
    let (y, saved) = plan.forward_alloc(&x, &w).unwrap();
    assert!(saved.is_empty());
    let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let pr = Params {
        gamma: gamma.iter().map(|&v| v as f64).collect(),
        beta: beta.iter().map(|&v| v as f64).collect(),
        w1: w1.iter().map(|&v| v as f64).collect(),
        b1: b1.iter().map(|&v| v as f64).collect(),
        w2: w2.iter().map(|&v| v as f64).collect(),
        b2: b2.iter().map(|&v| v as f64).collect(),
    };
    assert_close("y", &y.iter().map(|&v| v as f64).collect::<Vec<_>>(), &forward(cfg, &xr, &pr).y, TOL_F32);
    let err = plan.backward(&x, &x, &w, &saved).unwrap_err();
    assert_eq!(err.status(), lnmlp::Status::InvalidArgument, "{err}");
    assert!(!err.message().is_empty());
}
