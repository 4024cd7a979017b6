//! Micro-batches: reusing the plan's weight copies (`LNMLP_CALL_WEIGHTS_UNCHANGED`, through
//! `CallOptions`) and gradient accumulation (`lnmlp_desc_set_weight_gradients`, through
//! `PlanBuilder::accumulate_grads` / `grad_dtype` and `GradientsMut<T, G>`).
//!
//! Bitwise comparisons use single-threaded plans (`num_threads(1)`); accumulated gradients are
//! compared with the float64 reference of `common` at its tolerances.
mod common;

use common::*;
use lnmlp::*;

const MAX_T: usize = 8;
const H: usize = 16;
const F: usize = 24;

fn assert_bits<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_f32().to_bits() != b.to_f32().to_bits()) {
        panic!("{what}[{i}]: {:?} != {:?} (not bitwise equal)", got[i], want[i]);
    }
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_f32().to_bits() == y.to_f32().to_bits())
}

fn assert_grads_bits<T: Element>(what: &str, got: &Gradients<T>, want: &Gradients<T>) {
    assert_bits(&format!("{what} dx"), &got.dx, &want.dx);
    assert_bits(&format!("{what} dgamma"), &got.dgamma, &want.dgamma);
    assert_bits(&format!("{what} dbeta"), got.dbeta.as_ref().unwrap(), want.dbeta.as_ref().unwrap());
    assert_bits(&format!("{what} dw1"), &got.dw1, &want.dw1);
    assert_bits(&format!("{what} db1"), got.db1.as_ref().unwrap(), want.db1.as_ref().unwrap());
    assert_bits(&format!("{what} dw2"), &got.dw2, &want.dw2);
    assert_bits(&format!("{what} db2"), got.db2.as_ref().unwrap(), want.db2.as_ref().unwrap());
}

/// The float64 reference's configuration for a call with `t` tokens: layernorm, gelu, both
/// biases.
fn cfg(t: usize) -> Cfg {
    Cfg { t, h: H, f: F, rms: false, zero_centered: false, eps: 1e-5, acts: vec![Act::Gelu], bias1: true, bias2: true }
}

fn builder<T: Element>(recipe: Recipe) -> PlanBuilder {
    layernorm_gelu(MAX_T, H, F)
        .element::<T>()
        .recipe(recipe)
        .delayed_scaling(DelayedScaling { amax_history_len: 4, ..Default::default() })
}

/// The parameters and the inputs of the plan's most tokens, rounded to `T`.
fn problem<T: Element>(seed: u64) -> Problem<T> {
    Problem::random(seed, MAX_T, H, F, 1)
}

/// Every parameter: the plans here have LayerNorm and both biases.
fn all_weights<T: Element>(pr: &Problem<T>) -> Weights<'_, T> {
    pr.weights(true, (true, true))
}

fn reuse() -> CallOptions<'static> {
    CallOptions { weights_unchanged: true, ..Default::default() }
}

/// One forward + backward with the given options on both calls; returns y and the gradients.
fn step<T: Element>(plan: &mut Plan, x: &[T], dy: &[T], w: &Weights<'_, T>, flagged: bool) -> (Vec<T>, Gradients<T>) {
    let t = x.len() / H;
    let opts = || if flagged { reuse() } else { CallOptions::default() };
    let mut y = vec![T::default(); x.len()];
    let mut saved = plan.new_saved_for(t).unwrap();
    plan.forward_with_options(x, w, &mut y, &mut saved, opts()).unwrap();
    let mut g = plan.new_gradients::<T>(t).unwrap();
    plan.backward_with_options(dy, x, w, &saved, g.as_mut(), opts()).unwrap();
    (y, g)
}

fn current_supported() -> bool {
    let ok = query_support(Backend::Cpu, Feature::RecipeCurrent).unwrap().is_available();
    if !ok {
        eprintln!("skipped: current scaling not supported here");
    }
    ok
}

// ---- LNMLP_CALL_WEIGHTS_UNCHANGED --------------------------------------------------------------------

/// Micro-batches of varying token counts on two plans: one never flags, the other flags every call
/// after its first. With current scaling and unchanged weights, the flagged steps are bitwise the
/// unflagged ones.
fn flagged_equals_unflagged<T: Element>(recipe: Recipe, seed: u64) {
    let pr = problem::<T>(seed);
    let w = all_weights(&pr);
    let mut plain = builder::<T>(recipe).build().unwrap();
    let mut flagged = builder::<T>(recipe).build().unwrap();
    for (i, t) in [8, 3, 0, 5, 8, 1].into_iter().enumerate() {
        let (x, dy) = (&pr.x[..t * H], &pr.dy[..t * H]);
        let (y0, g0) = step(&mut plain, x, dy, &w, false);
        let (y1, g1) = step(&mut flagged, x, dy, &w, i > 0);
        assert_bits(&format!("step {i} (t={t}) y"), &y1, &y0);
        assert_grads_bits(&format!("step {i} (t={t})"), &g1, &g0);
    }
    // the flag on a plan's very first call makes the copies (nothing to reuse yet)
    let mut first = builder::<T>(recipe).build().unwrap();
    let (x, dy) = (&pr.x[..5 * H], &pr.dy[..5 * H]);
    let (y0, g0) = step(&mut plain, x, dy, &w, false);
    let (y1, g1) = step(&mut first, x, dy, &w, true);
    assert_bits("first call flagged y", &y1, &y0);
    assert_grads_bits("first call flagged", &g1, &g0);
}

#[test]
fn fp8_current_flagged_steps_equal_unflagged_bitwise() {
    if !current_supported() {
        return;
    }
    flagged_equals_unflagged::<f32>(Recipe::Current, 1);
    flagged_equals_unflagged::<Bf16>(Recipe::Current, 2);
}

#[test]
fn f16_and_f32_flagged_steps_equal_unflagged_bitwise() {
    flagged_equals_unflagged::<F16>(Recipe::None, 3); // widened weight copies
    flagged_equals_unflagged::<f32>(Recipe::None, 4); // no copies: the flag changes nothing
}

/// Halves w1 in place behind the flag: an FP8 plan keeps computing with its copies of the old
/// weights (proving that it reuses them), an f32 plan reads the new ones.
#[test]
fn halved_w1_behind_the_flag_fp8_reuses_old_copies_f32_sees_new_weights() {
    if !current_supported() {
        return;
    }
    let t = 6;
    let halve = |w1: &mut Vec<f32>| w1.iter_mut().for_each(|v| *v *= 0.5);

    // FP8: the first step makes the copies of w1 and w2; the flagged step with w1 halved gives
    // the old results, forward and backward, bitwise.
    let mut pr = problem::<f32>(5);
    let (x, dy) = (pr.x[..t * H].to_vec(), pr.dy[..t * H].to_vec());
    let mut fp8 = builder::<f32>(Recipe::Current).build().unwrap();
    let (y_old, g_old) = step(&mut fp8, &x, &dy, &all_weights(&pr), false);
    halve(&mut pr.w1);
    let (y_flag, g_flag) = step(&mut fp8, &x, &dy, &all_weights(&pr), true);
    assert_bits("fp8 flagged y", &y_flag, &y_old);
    assert_grads_bits("fp8 flagged", &g_flag, &g_old);
    // the raw call takes the flag too (w1 and w2 are the previous call's live buffers)
    let (y_raw, _) = forward_raw_on_host(&mut fp8, &x, &pr, &pr.w1, &pr.w2, CallFlags::WEIGHTS_UNCHANGED);
    assert_bits("fp8 raw flagged y", &y_raw, &y_old);
    // without the flag the plan makes new copies: new results, which the flag then keeps
    let (y_new, g_new) = step(&mut fp8, &x, &dy, &all_weights(&pr), false);
    assert!(!same_bits(&y_new, &y_old), "halving w1 did not change y");
    assert!(!same_bits(&g_new.dx, &g_old.dx), "halving w1 did not change dx");
    let (y_new2, g_new2) = step(&mut fp8, &x, &dy, &all_weights(&pr), true);
    assert_bits("fp8 flagged after remaking y", &y_new2, &y_new);
    assert_grads_bits("fp8 flagged after remaking", &g_new2, &g_new);

    // f32 (no copies): the flagged step sees the halved weights, bitwise as an unflagged one
    let mut pr = problem::<f32>(5);
    let mut f32_plan = builder::<f32>(Recipe::None).build().unwrap();
    let (y_old32, _) = step(&mut f32_plan, &x, &dy, &all_weights(&pr), false);
    halve(&mut pr.w1);
    let (y_flag32, g_flag32) = step(&mut f32_plan, &x, &dy, &all_weights(&pr), true);
    let (y_new32, g_new32) =
        step(&mut builder::<f32>(Recipe::None).build().unwrap(), &x, &dy, &all_weights(&pr), false);
    assert!(!same_bits(&y_flag32, &y_old32), "the f32 plan did not see the new w1");
    assert_bits("f32 flagged y", &y_flag32, &y_new32);
    assert_grads_bits("f32 flagged", &g_flag32, &g_new32);
}

/// Regression (the library read a flagged f32 call's weights through the previous call's w1 / w2
/// pointers): a flagged call may pass w1 and w2 in new buffers. Here they are new `Vec`s of
/// halved values while the old ones stay alive and unchanged, so reading the old addresses would
/// give the old results: an f32 plan (no copies) computes with the new buffers, bitwise as an
/// unflagged call with them, and an FP8 current-scaling plan with its copies of the old weights.
#[test]
fn the_flag_with_new_weight_buffers_reads_them_or_the_copies() {
    let t = 6;
    let pr = problem::<f32>(13);
    let (x, dy) = (&pr.x[..t * H], &pr.dy[..t * H]);
    let (w1_before, w2_before) = (pr.w1.clone(), pr.w2.clone());
    let half_w1: Vec<f32> = pr.w1.iter().map(|v| v * 0.5).collect();
    let half_w2: Vec<f32> = pr.w2.iter().map(|v| v * 0.5).collect();
    let halved = Weights { w1: &half_w1, w2: &half_w2, ..all_weights(&pr) };
    assert_ne!(half_w1.as_ptr(), pr.w1.as_ptr());
    assert_ne!(half_w2.as_ptr(), pr.w2.as_ptr());

    // f32: the flagged step after a step with the old buffers computes with the new ones
    let mut f32_plan = builder::<f32>(Recipe::None).build().unwrap();
    let (y_old, g_old) = step(&mut f32_plan, x, dy, &all_weights(&pr), false);
    let (y_flag, g_flag) = step(&mut f32_plan, x, dy, &halved, true);
    let (y_new, g_new) = step(&mut builder::<f32>(Recipe::None).build().unwrap(), x, dy, &halved, false);
    assert!(!same_bits(&y_new, &y_old), "halving the weights did not change y");
    assert!(!same_bits(&y_flag, &y_old), "the flagged f32 call computed with the previous call's weights");
    assert!(!same_bits(&g_flag.dx, &g_old.dx), "the flagged f32 backward computed with the previous call's weights");
    assert_bits("f32 flagged y", &y_flag, &y_new);
    assert_grads_bits("f32 flagged", &g_flag, &g_new);
    // the plan's first call may ask too (it has nothing to reuse), and so may a raw call
    let mut first = builder::<f32>(Recipe::None).build().unwrap();
    let (y_first, g_first) = step(&mut first, x, dy, &halved, true);
    assert_bits("f32 first call flagged y", &y_first, &y_new);
    assert_grads_bits("f32 first call flagged", &g_first, &g_new);
    step(&mut f32_plan, x, dy, &all_weights(&pr), false);
    let (y_raw, _) = forward_raw_on_host(&mut f32_plan, x, &pr, &half_w1, &half_w2, CallFlags::WEIGHTS_UNCHANGED);
    assert_bits("f32 raw flagged y", &y_raw, &y_new);

    // FP8 current scaling: the flagged step with the new buffers reuses the old weights' copies
    if current_supported() {
        let mut fp8 = builder::<f32>(Recipe::Current).build().unwrap();
        let (y_old8, g_old8) = step(&mut fp8, x, dy, &all_weights(&pr), false);
        let (y_flag8, g_flag8) = step(&mut fp8, x, dy, &halved, true);
        assert_bits("fp8 flagged y", &y_flag8, &y_old8);
        assert_grads_bits("fp8 flagged", &g_flag8, &g_old8);
        // without the flag it quantizes the new buffers
        let (y_new8, _) = step(&mut fp8, x, dy, &halved, false);
        assert!(!same_bits(&y_new8, &y_old8), "halving the weights did not change the FP8 plan's y");
    }

    // the old buffers were only read
    assert_bits("old w1", &pr.w1, &w1_before);
    assert_bits("old w2", &pr.w2, &w2_before);
}

/// Under delayed scaling a reused W1 copy keeps the scale it was made with, and the call records
/// the amax measured then.
#[test]
fn delayed_scaling_reused_copy_records_the_old_amax() {
    if !query_support(Backend::Cpu, Feature::RecipeDelayed).unwrap().is_available() {
        eprintln!("skipped: delayed scaling not supported here");
        return;
    }
    let mut pr = problem::<f32>(6);
    let amax = pr.w1.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let x = pr.x[..4 * H].to_vec();
    let mut plan = builder::<f32>(Recipe::Delayed).build().unwrap();
    let mut saved = plan.new_saved().unwrap();
    let mut y = vec![0.0f32; x.len()];
    plan.forward_into(&x, &all_weights(&pr), &mut y, &mut saved).unwrap();
    assert_eq!(plan.quantizer_state(Quantizer::W1).unwrap().amax_history[0], amax);
    pr.w1.iter_mut().for_each(|v| *v *= 0.5);
    plan.forward_with_options(&x, &all_weights(&pr), &mut y, &mut saved, reuse()).unwrap();
    let st = plan.quantizer_state(Quantizer::W1).unwrap();
    assert_eq!(&st.amax_history[..2], &[amax, amax], "the flagged call measured the new w1");
    plan.forward_into(&x, &all_weights(&pr), &mut y, &mut saved).unwrap();
    assert_eq!(plan.quantizer_state(Quantizer::W1).unwrap().amax_history[0], amax * 0.5);
}

#[test]
fn call_options_and_flags() {
    assert_eq!(CallOptions::default().flags(), CallFlags::DEFAULT);
    assert_eq!(reuse().flags(), CallFlags::WEIGHTS_UNCHANGED);
    assert_eq!(CallFlags::DEFAULT.raw(), ffi::LNMLP_CALL_DEFAULT);
    assert_eq!(CallFlags::WEIGHTS_UNCHANGED.raw(), ffi::LNMLP_CALL_WEIGHTS_UNCHANGED);
    let mut f = CallFlags::DEFAULT;
    f |= CallFlags::WEIGHTS_UNCHANGED;
    assert!(f.contains(CallFlags::WEIGHTS_UNCHANGED) && f.contains(CallFlags::DEFAULT));
    assert!(!CallFlags::DEFAULT.contains(CallFlags::WEIGHTS_UNCHANGED));
}

// ---- gradient accumulation ---------------------------------------------------------------------------

/// Three micro-batches of 5, 2 and 7 tokens (and an empty one between them) accumulated into
/// `G` gradients of a `T` plan that start at nonzero values: the result is the initial values
/// plus the sum of the float64 reference's gradients of the three; dx, dgamma and dbeta are the
/// last micro-batch's alone.
fn accumulate<T: Element, G: Element>(grad_dtype: Option<DType>, tol: f64, seed: u64) {
    let pr = problem::<T>(seed);
    let w = all_weights(&pr);
    let mut b = builder::<T>(Recipe::None).accumulate_grads(true).num_threads(2);
    if let Some(d) = grad_dtype {
        b = b.grad_dtype(d);
    }
    let mut plan = b.build().unwrap();
    assert!(plan.accumulates_grads());
    assert_eq!(plan.grad_dtype(), G::DTYPE);
    for t in [Tensor::DW1, Tensor::DB1, Tensor::DW2, Tensor::DB2] {
        assert_eq!(plan.tensor_shape(t, Tokens::Max).unwrap().unwrap().element_type(), G::DTYPE.into(), "{t}");
    }
    for t in [Tensor::Dx, Tensor::DGamma, Tensor::DBeta] {
        assert_eq!(plan.tensor_shape(t, Tokens::Max).unwrap().unwrap().element_type(), T::DTYPE.into(), "{t}");
    }

    // the accumulators: nonzero initial values, exact in G
    let mut r = Rng::new(seed + 100);
    let mut init = |n: usize| -> Vec<G> { r.vec(n, 0.5).into_iter().map(|v| G::from_f32(v as f32)).collect() };
    let (mut dw1, mut db1, mut dw2, mut db2) = (init(H * F), init(F), init(F * H), init(H));
    let (dw1_0, db1_0, dw2_0, db2_0) = (f64s(&dw1), f64s(&db1), f64s(&dw2), f64s(&db2));
    let (mut want_dw1, mut want_db1, mut want_dw2, mut want_db2) =
        (dw1_0.clone(), db1_0.clone(), dw2_0.clone(), db2_0.clone());
    let add = |acc: &mut Vec<f64>, g: &[f64]| acc.iter_mut().zip(g).for_each(|(a, b)| *a += b);

    let (mut dgamma, mut dbeta) = (vec![T::default(); H], vec![T::default(); H]);
    let params = pr.params();
    let mut last = None;
    // micro-batch k takes rows [off, off + t) of the problem's inputs
    for (k, (off, t)) in [(0, 5), (5, 0), (1, 2), (0, 7)].into_iter().enumerate() {
        let (x, dy) = (&pr.x[off * H..(off + t) * H], &pr.dy[off * H..(off + t) * H]);
        let saved = plan.forward_alloc(x, &w).unwrap().1;
        let mut dx = vec![T::from_f32(9.0); t * H];
        let before = (dw1.clone(), db1.clone(), dw2.clone(), db2.clone());
        let out = GradientsMut {
            dx: &mut dx,
            dgamma: &mut dgamma,
            dbeta: Some(&mut dbeta),
            dw1: &mut dw1,
            db1: Some(&mut db1),
            dw2: &mut dw2,
            db2: Some(&mut db2),
        };
        plan.backward_into(dy, x, &w, &saved, out).unwrap();
        if t == 0 {
            // a backward with no tokens leaves the accumulators alone
            assert_bits(&format!("micro-batch {k} dw1"), &dw1, &before.0);
            assert_bits(&format!("micro-batch {k} db1"), &db1, &before.1);
            assert_bits(&format!("micro-batch {k} dw2"), &dw2, &before.2);
            assert_bits(&format!("micro-batch {k} db2"), &db2, &before.3);
            continue;
        }
        let rg = backward(&cfg(t), &f64s(x), &params, &f64s(dy));
        add(&mut want_dw1, &rg.dw1);
        add(&mut want_db1, &rg.db1);
        add(&mut want_dw2, &rg.dw2);
        add(&mut want_db2, &rg.db2);
        last = Some((rg, dx));
    }
    assert_close("accumulated dw1", &f64s(&dw1), &want_dw1, tol);
    assert_close("accumulated db1", &f64s(&db1), &want_db1, tol);
    assert_close("accumulated dw2", &f64s(&dw2), &want_dw2, tol);
    assert_close("accumulated db2", &f64s(&db2), &want_db2, tol);
    // the accumulation really added (not overwrote): the sums differ from the initial values and
    // from the last micro-batch's gradient alone
    let (rg, dx) = last.unwrap();
    assert!(f64s(&dw1).iter().zip(&dw1_0).any(|(a, b)| (a - b).abs() > 1e-3));
    assert!(f64s(&db2).iter().zip(&rg.db2).any(|(a, b)| (a - b).abs() > 1e-2));
    // dx, dgamma and dbeta are overwritten: the last micro-batch's
    assert_close("last dx", &f64s(&dx), &rg.dx, tol);
    assert_close("last dgamma", &f64s(&dgamma), &rg.dgamma, tol);
    assert_close("last dbeta", &f64s(&dbeta), &rg.dbeta, tol);
}

#[test]
fn accumulates_three_micro_batches_into_f32_grads_of_a_bf16_plan() {
    accumulate::<Bf16, f32>(Some(DType::F32), TOL_BF16, 7);
}

#[test]
fn accumulates_three_micro_batches_into_f32_grads_of_an_f32_plan() {
    accumulate::<f32, f32>(None, TOL_F32, 8);
    accumulate::<f32, f32>(Some(DType::F32), TOL_F32, 9);
}

#[test]
fn accumulates_with_the_weights_unchanged_flag_too() {
    // the two features together, on an f16 plan (widened weight copies) with f32 gradients:
    // flagged micro-batches accumulate bitwise what unflagged ones do
    let pr = problem::<F16>(10);
    let w = all_weights(&pr);
    let mk = || builder::<F16>(Recipe::None).accumulate_grads(true).grad_dtype(DType::F32).build().unwrap();
    let (mut a, mut b) = (mk(), mk());
    let mut ga = a.new_gradients_as::<F16, f32>(0).unwrap();
    let mut gb = b.new_gradients_as::<F16, f32>(0).unwrap();
    for (i, t) in [5, 2, 7].into_iter().enumerate() {
        let (x, dy) = (&pr.x[..t * H], &pr.dy[..t * H]);
        for (plan, g, flagged) in [(&mut a, &mut ga, false), (&mut b, &mut gb, i > 0)] {
            let opts = || if flagged { reuse() } else { CallOptions::default() };
            let mut saved = plan.new_saved().unwrap();
            plan.forward_with_options(x, &w, &mut vec![F16::default(); t * H], &mut saved, opts()).unwrap();
            g.dx = vec![F16::default(); t * H];
            plan.backward_with_options(dy, x, &w, &saved, g.as_mut(), opts()).unwrap();
        }
        assert_bits(&format!("micro-batch {i} dx"), &gb.dx, &ga.dx);
    }
    assert_bits("dw1", &gb.dw1, &ga.dw1);
    assert_bits("dw2", &gb.dw2, &ga.dw2);
    assert_bits("db1", gb.db1.as_ref().unwrap(), ga.db1.as_ref().unwrap());
    assert_bits("db2", gb.db2.as_ref().unwrap(), ga.db2.as_ref().unwrap());
    assert!(ga.dw1.iter().any(|&v| v != 0.0));
}

// ---- misuse ------------------------------------------------------------------------------------------

#[test]
fn a_bad_gradient_dtype_is_refused_at_build() {
    for (io, grad) in [(DType::Bf16, DType::F16), (DType::F16, DType::Bf16), (DType::F32, DType::Bf16)] {
        let e = PlanBuilder::new().shape(4, 8, 16).dtype(io).grad_dtype(grad).build().unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{io:?}/{grad:?}: {e}");
        assert!(e.message().contains("weight gradients"), "{e}");
    }
    // the I/O dtype itself and f32 are accepted, with or without accumulation
    for (io, grad, acc) in
        [(DType::Bf16, DType::Bf16, true), (DType::F16, DType::F32, false), (DType::F32, DType::F32, true)]
    {
        let p = PlanBuilder::new().shape(4, 8, 16).dtype(io).grad_dtype(grad).accumulate_grads(acc).build().unwrap();
        assert_eq!((p.dtype(), p.grad_dtype(), p.accumulates_grads()), (io, grad, acc));
    }
    let p = PlanBuilder::new().shape(4, 8, 16).dtype(DType::Bf16).build().unwrap();
    assert_eq!((p.grad_dtype(), p.accumulates_grads()), (DType::Bf16, false));
}

/// A bf16 plan with f32 weight gradients: gradient buffers of the wrong element type are
/// refused before the library is called, whatever way they are passed.
#[test]
fn wrongly_typed_gradient_buffers_are_an_error_not_ub() {
    let pr = problem::<Bf16>(11);
    let w = all_weights(&pr);
    let t = 3;
    let (x, dy) = (&pr.x[..t * H], &pr.dy[..t * H]);
    for acc in [false, true] {
        let mut plan = builder::<Bf16>(Recipe::None).grad_dtype(DType::F32).accumulate_grads(acc).build().unwrap();
        let saved = plan.forward_alloc(x, &w).unwrap().1;

        // Leave a known library message, then show the checks below never reach the library.
        let first = PlanBuilder::new().shape(0, 1, 1).build().unwrap_err();
        let before = last_error();
        assert_eq!(before, first.message());

        // bf16 weight gradients for f32 ones
        let e = plan.new_gradients::<Bf16>(t).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().starts_with("dw1 is Bf16, but this plan's weight gradients"), "{e}");
        assert!(e.message().contains("new_gradients_as::<Bf16, f32>"), "{e}");
        let mut wrong = PlanBuilder::new()
            .shape(MAX_T, H, F)
            .bias(true, true)
            .dtype(DType::Bf16)
            .build()
            .unwrap()
            .new_gradients::<Bf16>(t)
            .unwrap();
        let e = plan.backward_into(dy, x, &w, &saved, wrong.as_mut()).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().starts_with("dw1 is Bf16, but this plan's weight gradients dW1, db1, dW2, db2 are F32"));
        // only db2 wrongly typed: each of the four is checked
        let mut good = plan.new_gradients_as::<Bf16, f32>(t).unwrap();
        let mut db2_bf16 = vec![Bf16::default(); H];
        let mut g = good.as_mut();
        let e = {
            let mixed: GradientsMut<'_, Bf16, Bf16> = GradientsMut {
                dx: g.dx,
                dgamma: g.dgamma,
                dbeta: g.dbeta.take(),
                dw1: &mut wrong.dw1,
                db1: wrong.db1.as_deref_mut(),
                dw2: &mut wrong.dw2,
                db2: Some(&mut db2_bf16),
            };
            plan.backward_into(dy, x, &w, &saved, mixed).unwrap_err()
        };
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        // f32 everywhere: dx, dgamma, dbeta must be the I/O type
        let all_f32 = PlanBuilder::new().shape(MAX_T, H, F).bias(true, true).build().unwrap();
        let mut g32 = all_f32.new_gradients::<f32>(t).unwrap();
        let e = plan.new_gradients_as::<f32, f32>(t).unwrap_err();
        assert!(e.message().starts_with("dx is F32, but the plan's dx is Bf16"), "{e}");
        let (x32, dy32) = (f64s(x), f64s(dy));
        let (x32, dy32): (Vec<f32>, Vec<f32>) =
            (x32.iter().map(|&v| v as f32).collect(), dy32.iter().map(|&v| v as f32).collect());
        let p32 = problem::<f32>(11);
        let e = plan.backward_into(&dy32, &x32, &all_weights(&p32), &saved, g32.as_mut()).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains("the plan's dtype is Bf16"), "{e}");
        // the allocating backward cannot hold f32 weight gradients (nor accumulate)
        let e = plan.backward(dy, x, &w, &saved).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert_eq!(last_error(), before, "a check reached the library");

        // the right types work
        plan.backward_into(dy, x, &w, &saved, good.as_mut()).unwrap();
        assert!(good.dw1.iter().any(|&v| v != 0.0));
    }
}

#[test]
fn an_accumulating_plan_refuses_the_allocating_backward() {
    let pr = problem::<f32>(12);
    let w = all_weights(&pr);
    let x = &pr.x[..2 * H];
    let mut plan = builder::<f32>(Recipe::None).accumulate_grads(true).build().unwrap();
    let saved = plan.forward_alloc(x, &w).unwrap().1;
    let e = plan.backward(&pr.dy[..2 * H], x, &w, &saved).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("accumulates") && e.message().contains("backward_into"), "{e}");
    // new_gradients gives fresh (zero) accumulators, which backward_into adds into
    let mut g = plan.new_gradients::<f32>(2).unwrap();
    plan.backward_into(&pr.dy[..2 * H], x, &w, &saved, g.as_mut()).unwrap();
    let once = g.clone();
    plan.backward_into(&pr.dy[..2 * H], x, &w, &saved, g.as_mut()).unwrap();
    for (a, b) in g.dw2.iter().zip(&once.dw2) {
        assert!((a - 2.0 * b).abs() <= 1e-6 * b.abs().max(1e-3), "{a} != 2 * {b}");
    }
    assert_bits("dx (overwritten)", &g.dx, &once.dx);
}
