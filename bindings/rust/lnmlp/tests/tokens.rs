//! ABI 2: every call takes its own token count (0 ..= the plan's most), the library's shape
//! query, and caller-owned FP8 state (per call and attached).
//!
//! A call with t tokens must compute exactly what a plan made for t tokens computes, so the
//! comparisons here are bitwise (single-threaded plans: `num_threads(1)`).
mod common;

use common::{forward_raw_on_host, Problem};
use lnmlp::*;

const MAX_T: usize = 37;

/// Bit patterns, so that equality is bitwise (and NaN-safe).
fn bits<T: Element>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

fn assert_bits<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_f32().to_bits() != b.to_f32().to_bits()) {
        panic!("{what}[{i}]: {:?} != {:?} (not bitwise equal)", got[i], want[i]);
    }
}

fn assert_grads_bits<T: Element>(what: &str, got: &Gradients<T>, want: &Gradients<T>) {
    assert_bits(&format!("{what} dx"), &got.dx, &want.dx);
    assert_bits(&format!("{what} dgamma"), &got.dgamma, &want.dgamma);
    assert_eq!(got.dbeta.is_some(), want.dbeta.is_some(), "{what} dbeta");
    if let (Some(a), Some(b)) = (&got.dbeta, &want.dbeta) {
        assert_bits(&format!("{what} dbeta"), a, b);
    }
    assert_bits(&format!("{what} dw1"), &got.dw1, &want.dw1);
    assert_eq!(got.db1.is_some(), want.db1.is_some(), "{what} db1");
    if let (Some(a), Some(b)) = (&got.db1, &want.db1) {
        assert_bits(&format!("{what} db1"), a, b);
    }
    assert_bits(&format!("{what} dw2"), &got.dw2, &want.dw2);
    assert_eq!(got.db2.is_some(), want.db2.is_some(), "{what} db2");
    if let (Some(a), Some(b)) = (&got.db2, &want.db2) {
        assert_bits(&format!("{what} db2"), a, b);
    }
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    h: usize,
    f: usize,
    norm: Norm,
    gated: bool,
    bias: (bool, bool),
    remat: Remat,
    recipe: Recipe,
}

impl Setup {
    fn a(&self) -> usize {
        if self.gated {
            2
        } else {
            1
        }
    }

    fn builder<T: Element>(&self, tokens: usize) -> PlanBuilder {
        let b = PlanBuilder::new()
            .shape(tokens, self.h, self.f)
            .norm(self.norm)
            .bias(self.bias.0, self.bias.1)
            .remat(self.remat)
            .recipe(self.recipe)
            .delayed_scaling(DelayedScaling { amax_history_len: 4, ..Default::default() })
            .element::<T>()
            .num_threads(1);
        if self.gated {
            b.gated(Activation::Silu, Activation::Linear)
        } else {
            b.activation(Activation::Gelu)
        }
    }
}

/// The inputs of the plan's most tokens; a call with t tokens takes the first t rows.
fn problem<T: Element>(s: &Setup, seed: u64) -> Problem<T> {
    Problem::random(seed, MAX_T, s.h, s.f, s.a())
}

/// The parameters the setup's plan takes.
fn setup_weights<'a, T: Element>(pr: &'a Problem<T>, s: &Setup) -> Weights<'a, T> {
    pr.weights(s.norm == Norm::LayerNorm, s.bias)
}

/// A plan for MAX_T tokens run with t = 37, 1, 13, 0, 37, 13 (repeats and shrinking counts
/// included) against a plan made for exactly t: y and every gradient bitwise equal, with the
/// saved buffer sized for the call and with the plan's full-size one.
fn same_as_exact_plans<T: Element>(s: Setup, seed: u64) {
    let pr = problem::<T>(&s, seed);
    let w = setup_weights(&pr, &s);
    let h = s.h;
    let mut big = s.builder::<T>(MAX_T).build().unwrap();
    assert_eq!(big.max_tokens(), MAX_T);
    let mut full = big.new_saved().unwrap();
    for t in [37, 1, 13, 0, 37, 13] {
        let (x, dy) = (&pr.x[..t * h], &pr.dy[..t * h]);
        let (y, saved) = big.forward_alloc(x, &w).unwrap();
        assert_eq!(y.len(), t * h);
        assert_eq!(saved.tokens(), Some(t));
        assert_eq!(saved.len(), big.saved_bytes_for(t).unwrap());
        assert!(saved.len() <= big.saved_bytes());
        let g = big.backward(dy, x, &w, &saved).unwrap();
        assert_eq!(g.dx.len(), t * h);

        // the plan's full-size saved buffer serves the call too
        let mut y_full = vec![T::default(); t * h];
        big.forward_into(x, &w, &mut y_full, &mut full).unwrap();
        assert_bits(&format!("t={t} y (full saved)"), &y_full, &y);
        let g_full = big.backward(dy, x, &w, &full).unwrap();
        assert_grads_bits(&format!("t={t} (full saved)"), &g_full, &g);

        if t == 0 {
            continue; // no plan is made for 0 tokens; see zero_tokens
        }
        let mut exact = s.builder::<T>(t).build().unwrap();
        let (y_exact, saved_exact) = exact.forward_alloc(x, &w).unwrap();
        assert_bits(&format!("t={t} y"), &y, &y_exact);
        let g_exact = exact.backward(dy, x, &w, &saved_exact).unwrap();
        assert_grads_bits(&format!("t={t}"), &g, &g_exact);
    }
}

/// Counts whose GEMMs the plan made when it was built (`prepared_tokens`) give, like any count, the
/// bits of a plan made for exactly that count; the builder's refusals.
#[test]
fn prepared_token_counts_match_exact_plans() {
    let s = ln_gelu();
    let pr = problem::<f32>(&s, 11);
    let w = setup_weights(&pr, &s);
    let mut big = s.builder::<f32>(MAX_T).prepared_tokens(&[16, 1, 16]).build().unwrap();
    for t in [16, 1, 5, 16] {
        let (x, dy) = (&pr.x[..t * s.h], &pr.dy[..t * s.h]);
        let (y, saved) = big.forward_alloc(x, &w).unwrap();
        let g = big.backward(dy, x, &w, &saved).unwrap();
        let mut exact = s.builder::<f32>(t).build().unwrap();
        let (y_exact, saved_exact) = exact.forward_alloc(x, &w).unwrap();
        assert_bits(&format!("t={t} y"), &y, &y_exact);
        assert_grads_bits(&format!("t={t}"), &g, &exact.backward(dy, x, &w, &saved_exact).unwrap());
    }
    for bad in [vec![0], vec![MAX_T + 1], (1..=33).collect::<Vec<usize>>()] {
        let e = s.builder::<f32>(MAX_T).prepared_tokens(&bad).build().unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{bad:?}: {e}");
    }
}

fn ln_gelu() -> Setup {
    Setup {
        h: 16,
        f: 24,
        norm: Norm::LayerNorm,
        gated: false,
        bias: (true, true),
        remat: Remat::SaveAll,
        recipe: Recipe::None,
    }
}

/// The layernorm-gelu setup's f32 problem and a plan for MAX_T tokens.
fn ln_gelu_f32(seed: u64) -> (Setup, Problem<f32>, Plan) {
    let s = ln_gelu();
    let pr = problem::<f32>(&s, seed);
    let plan = s.builder::<f32>(MAX_T).build().unwrap();
    (s, pr, plan)
}

fn rms_swiglu(remat: Remat) -> Setup {
    Setup { h: 24, f: 40, norm: Norm::RmsNorm, gated: true, bias: (true, false), remat, recipe: Recipe::None }
}

#[test]
fn f32_variable_tokens_match_exact_plans_layernorm_gelu() {
    same_as_exact_plans::<f32>(ln_gelu(), 1);
}

#[test]
fn f32_variable_tokens_match_exact_plans_rmsnorm_swiglu_every_remat() {
    for (i, remat) in [Remat::SaveAll, Remat::SaveFfn1, Remat::SaveStats].into_iter().enumerate() {
        same_as_exact_plans::<f32>(rms_swiglu(remat), 2 + i as u64);
    }
}

#[test]
fn bf16_variable_tokens_match_exact_plans() {
    same_as_exact_plans::<Bf16>(ln_gelu(), 5);
    same_as_exact_plans::<Bf16>(rms_swiglu(Remat::SaveStats), 6);
}

#[test]
fn f16_variable_tokens_match_exact_plans() {
    same_as_exact_plans::<F16>(ln_gelu(), 7);
}

#[test]
fn fp8_current_variable_tokens_match_exact_plans() {
    if !query_support(Backend::Cpu, Feature::RecipeCurrent).unwrap().is_available() {
        eprintln!("skipped: current scaling not supported here");
        return;
    }
    same_as_exact_plans::<f32>(Setup { recipe: Recipe::Current, ..ln_gelu() }, 8);
}

#[test]
fn zero_tokens() {
    let (s, pr, mut plan) = ln_gelu_f32(9);
    let w = setup_weights(&pr, &s);
    let mut y: Vec<f32> = Vec::new();
    let saved = plan.forward(&[], &w, &mut y).unwrap();
    assert_eq!(saved.tokens(), Some(0));
    let (y, _) = plan.forward_alloc(&[], &w).unwrap();
    assert!(y.is_empty());
    // backward overwrites the parameter gradients with zeros
    let mut g = plan.new_gradients::<f32>(0).unwrap();
    assert!(g.dx.is_empty());
    for v in [&mut g.dgamma, &mut g.dw1, &mut g.dw2].into_iter().chain(g.dbeta.as_mut()).chain(g.db1.as_mut()) {
        v.iter_mut().for_each(|e| *e = 7.0);
    }
    g.db2.as_mut().unwrap().iter_mut().for_each(|e| *e = 7.0);
    plan.backward_into(&[], &[], &w, &saved, g.as_mut()).unwrap();
    let all = [&g.dgamma, &g.dw1, &g.dw2, g.dbeta.as_ref().unwrap(), g.db1.as_ref().unwrap(), g.db2.as_ref().unwrap()];
    for v in all {
        assert!(!v.is_empty() && v.iter().all(|&e| e.to_bits() == 0), "{v:?}");
    }
    assert_eq!(plan.backward(&[], &[], &w, &saved).unwrap(), g);
    // a full-size saved buffer and an empty one both do for 0 tokens
    let mut full = plan.new_saved().unwrap();
    plan.forward_into(&[], &w, &mut [], &mut full).unwrap();
    plan.forward_into(&[], &w, &mut [], &mut Saved::new(0, 64).unwrap()).unwrap();
    // and the plan still works afterwards
    let (y, saved) = plan.forward_alloc(&pr.x[..3 * s.h], &w).unwrap();
    assert_eq!(y.len(), 3 * s.h);
    plan.backward(&pr.dy[..3 * s.h], &pr.x[..3 * s.h], &w, &saved).unwrap();

    // forward-only plans run 0 tokens too
    let mut fo = Setup { remat: Remat::ForwardOnly, ..s }.builder::<f32>(MAX_T).build().unwrap();
    let (y, saved) = fo.forward_alloc(&[], &w).unwrap();
    assert!(y.is_empty() && saved.is_empty());
}

#[test]
fn zero_tokens_leave_the_fp8_state_alone() {
    if !query_support(Backend::Cpu, Feature::RecipeDelayed).unwrap().is_available() {
        eprintln!("skipped: delayed scaling not supported here");
        return;
    }
    let s = Setup { recipe: Recipe::Delayed, ..ln_gelu() };
    let pr = problem::<f32>(&s, 10);
    let w = setup_weights(&pr, &s);
    let mut plan = s.builder::<f32>(MAX_T).build().unwrap();
    let (_, saved) = plan.forward_alloc(&pr.x[..5 * s.h], &w).unwrap(); // a nontrivial state
    plan.backward(&pr.dy[..5 * s.h], &pr.x[..5 * s.h], &w, &saved).unwrap();
    let before = plan.fp8_state().unwrap();
    let (_, saved0) = plan.forward_alloc(&[], &w).unwrap();
    plan.backward(&[], &[], &w, &saved0).unwrap();
    assert_bits("state", &plan.fp8_state().unwrap(), &before);
    let mut state = before.clone();
    plan.forward_with_state(&[], &w, &mut [], &mut plan.new_saved().unwrap(), &mut state).unwrap();
    assert_bits("caller state", &state, &before);
}

#[test]
fn too_many_tokens_or_a_ragged_length_is_an_error_not_a_panic() {
    let (s, pr, mut plan) = ln_gelu_f32(11);
    let h = s.h;
    let w = setup_weights(&pr, &s);
    let x38 = vec![0.5f32; (MAX_T + 1) * h];
    let mut y38 = vec![0.0f32; (MAX_T + 1) * h];
    let (y, saved) = plan.forward_alloc(&pr.x, &w).unwrap();

    // Leave a known library message, then show the checks below never reach the library.
    let first = PlanBuilder::new().shape(0, 1, 1).build().unwrap_err();
    let before = last_error();
    assert_eq!(before, first.message());

    let too_many = [
        plan.forward(&x38, &w, &mut y38).unwrap_err(),
        plan.forward_alloc(&x38, &w).unwrap_err(),
        plan.forward_into(&x38, &w, &mut y38, &mut plan.new_saved().unwrap()).unwrap_err(),
        plan.backward(&x38, &x38, &w, &saved).unwrap_err(),
        plan.tensor_shape(Tensor::X, MAX_T + 1).unwrap_err(),
        plan.new_gradients::<f32>(MAX_T + 1).unwrap_err(),
        plan.saved_bytes_for(MAX_T + 1).unwrap_err(),
        plan.new_saved_for(usize::MAX).unwrap_err(),
    ];
    for e in &too_many {
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains("at most 37 tokens per call"), "{e}");
    }
    assert!(too_many[0].message().starts_with("x has 38 tokens"), "{}", too_many[0]);

    // a length that is not a multiple of H
    let e = plan.forward(&pr.x[..3 * h + 1], &w, &mut vec![0.0; 3 * h + 1]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("x has 49 elements, which is not a multiple of H = 16"), "{e}");
    let e = plan.backward(&pr.dy[..h], &pr.x[..h - 1], &w, &saved).unwrap_err();
    assert!(e.message().contains("not a multiple of H"), "{e}");

    // y, dy, dx must be as long as x
    let e = plan.forward(&pr.x[..3 * h], &w, &mut vec![0.0; 2 * h]).unwrap_err();
    assert!(e.message().starts_with("y has 32 elements, but the plan needs [tokens, H] = [3, 16] = 48"), "{e}");
    let e = plan.backward(&y[..2 * h], &pr.x, &w, &saved).unwrap_err();
    assert!(e.message().starts_with("dy has 32 elements"), "{e}");
    let mut g = plan.new_gradients::<f32>(MAX_T).unwrap();
    g.dx.truncate(h);
    let e = plan.backward_into(&y, &pr.x, &w, &saved, g.as_mut()).unwrap_err();
    assert!(e.message().starts_with("dx has 16 elements"), "{e}");

    // the raw path checks the count too
    let n = std::ptr::null_mut();
    // SAFETY: the count is refused before any pointer is used.
    let e = unsafe { plan.forward_raw(MAX_T + 1, n, n, n, n, n, n, n, n, n, n, CallFlags::DEFAULT, n) }.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // SAFETY: as above.
    let e =
        unsafe { plan.backward_raw(MAX_T + 1, n, n, n, n, n, n, n, n, n, n, n, n, n, n, n, n, CallFlags::DEFAULT, n) }
            .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");

    assert_eq!(last_error(), before, "a check reached the library");
    // the plan is unharmed
    let (y2, _) = plan.forward_alloc(&pr.x, &w).unwrap();
    assert_bits("y", &y2, &y);
}

#[test]
fn raw_calls_take_the_token_count() {
    let (s, pr, mut plan) = ln_gelu_f32(12);
    let h = s.h;
    let w = setup_weights(&pr, &s);
    let t = 13;
    let (y, saved) = plan.forward_alloc(&pr.x[..t * h], &w).unwrap();
    let (y_raw, saved_raw) = forward_raw_on_host(&mut plan, &pr.x[..t * h], &pr, &pr.w1, &pr.w2, CallFlags::DEFAULT);
    assert_bits("y", &y_raw, &y);
    assert_eq!(saved_raw.as_bytes(), saved.as_bytes());
}

#[test]
fn tensor_shapes_come_from_the_library() {
    let plan = PlanBuilder::new()
        .shape(MAX_T, 8, 16)
        .norm(Norm::RmsNorm)
        .activation_name("swiglu")
        .bias(true, false)
        .build()
        .unwrap();
    let sh = |t: Tensor, k: Tokens| plan.tensor_shape(t, k).unwrap();
    let dims = |t: Tensor, k: Tokens| sh(t, k).map(|s| s.dims().to_vec());
    let max = Tokens::Max;
    assert_eq!(dims(Tensor::X, max), Some(vec![MAX_T, 8]));
    assert_eq!(dims(Tensor::X, Tokens::Count(13)), Some(vec![13, 8]));
    assert_eq!(dims(Tensor::Dx, 0.into()), Some(vec![0, 8]));
    assert!(sh(Tensor::Y, 0.into()).unwrap().is_empty());
    assert_eq!(dims(Tensor::W1, max), Some(vec![8, 2, 16]));
    assert_eq!(dims(Tensor::DW1, 5.into()), Some(vec![8, 2, 16]));
    assert_eq!(dims(Tensor::B1, max), Some(vec![2, 16]));
    assert_eq!(dims(Tensor::W2, max), Some(vec![16, 8]));
    assert_eq!(dims(Tensor::Gamma, max), Some(vec![8]));
    for absent in [Tensor::Beta, Tensor::DBeta, Tensor::B2, Tensor::DB2, Tensor::Fp8State] {
        assert_eq!(sh(absent, max), None, "{absent}");
    }
    let x = sh(Tensor::X, max).unwrap();
    assert_eq!((x.rank(), x.len(), x.element_type(), x.bytes()), (2, MAX_T * 8, ElementType::F32, MAX_T * 32));
    assert_eq!(x.to_string(), "[37, 8]");
    let saved = sh(Tensor::Saved, max).unwrap();
    assert_eq!((saved.element_type(), saved.bytes()), (ElementType::U8, plan.saved_bytes()));
    let mut last = 0;
    for t in 0..=MAX_T {
        let b = plan.saved_bytes_for(t).unwrap();
        assert!(b >= last && b <= plan.saved_bytes(), "t={t}: {b}");
        last = b;
    }
    assert_eq!((plan.x_len(), plan.w1_len(), plan.b1_len(), plan.w2_len()), (MAX_T * 8, 8 * 2 * 16, 32, 16 * 8));
    assert_eq!((plan.max_tokens(), plan.local_tokens(), plan.local_ffn(), plan.fp8_state_len()), (MAX_T, MAX_T, 16, 0));
    for (i, t) in Tensor::ALL.into_iter().enumerate() {
        assert_eq!(t.raw(), i as i32, "{t}");
    }
    assert_eq!(Tensor::ALL.len(), ffi::LNMLP_TENSOR_COUNT as usize);

    let bf = PlanBuilder::new().shape(4, 8, 16).dtype(DType::Bf16).build().unwrap();
    assert_eq!(bf.tensor_shape(Tensor::W2, Tokens::Max).unwrap().unwrap().element_type(), ElementType::Bf16);
    assert_eq!(bf.tensor_shape(Tensor::Saved, 2).unwrap().unwrap().element_type(), ElementType::U8);
    let fo = PlanBuilder::new().shape(4, 8, 16).remat(Remat::ForwardOnly).build().unwrap();
    assert_eq!(fo.tensor_shape(Tensor::Saved, Tokens::Max).unwrap(), None);
    assert_eq!(fo.saved_bytes_for(3).unwrap(), 0);
}

// ---- caller-owned FP8 state ------------------------------------------------------------------------

const HIST: usize = 4;

fn delayed() -> Option<Setup> {
    if !query_support(Backend::Cpu, Feature::RecipeDelayed).unwrap().is_available() {
        eprintln!("skipped: delayed scaling not supported here");
        return None;
    }
    Some(Setup { recipe: Recipe::Delayed, ..ln_gelu() })
}

/// The steps the state tests run: varying token counts (0 included) and input scales, so each
/// step records a different amax.
const STEPS: [(usize, f32); 6] = [(37, 1.0), (13, 3.0), (0, 1.0), (1, 0.25), (37, 2.0), (5, 8.0)];

fn scaled(v: &[f32], k: f32) -> Vec<f32> {
    v.iter().map(|x| x * k).collect()
}

#[test]
fn delayed_state_shape_and_fresh_state() {
    let Some(s) = delayed() else { return };
    let plan = s.builder::<f32>(MAX_T).build().unwrap();
    let shape = plan.tensor_shape(Tensor::Fp8State, Tokens::Max).unwrap().unwrap();
    assert_eq!((shape.dims(), shape.element_type()), (&[6, 1 + HIST][..], ElementType::F32));
    assert_eq!(plan.fp8_state_len(), 6 * (1 + HIST));
    assert_eq!(plan.amax_history_length(), HIST);
    let fresh = plan.new_fp8_state().unwrap();
    assert_eq!(fresh, plan.fp8_state().unwrap());
    for row in fresh.chunks(1 + HIST) {
        assert_eq!(row, &[1.0, 0.0, 0.0, 0.0, 0.0]);
    }
    // stateless plans have none
    let none = ln_gelu().builder::<f32>(4).build().unwrap();
    assert_eq!(none.fp8_state_len(), 0);
    assert_eq!(none.new_fp8_state().unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn caller_owned_state_per_call_matches_the_plan_held_state() {
    let Some(s) = delayed() else { return };
    let h = s.h;
    let pr = problem::<f32>(&s, 13);
    let w = setup_weights(&pr, &s);
    let mut own = s.builder::<f32>(MAX_T).build().unwrap();
    let mut caller = s.builder::<f32>(MAX_T).build().unwrap();
    let fresh = caller.new_fp8_state().unwrap();
    let mut state = fresh.clone();
    let (mut saved_own, mut saved_caller) = (own.new_saved().unwrap(), caller.new_saved().unwrap());
    for (t, k) in STEPS {
        let x = scaled(&pr.x[..t * h], k);
        let dy = scaled(&pr.dy[..t * h], 1.0 / k);
        let (mut y_own, mut y_caller) = (vec![0.0f32; t * h], vec![0.0f32; t * h]);
        own.forward_into(&x, &w, &mut y_own, &mut saved_own).unwrap();
        caller.forward_with_state(&x, &w, &mut y_caller, &mut saved_caller, &mut state).unwrap();
        assert_bits(&format!("t={t} y"), &y_caller, &y_own);
        assert_bits(&format!("t={t} state after forward"), &state, &own.fp8_state().unwrap());

        let mut g_own = own.new_gradients::<f32>(t).unwrap();
        let mut g_caller = caller.new_gradients::<f32>(t).unwrap();
        own.backward_into(&dy, &x, &w, &saved_own, g_own.as_mut()).unwrap();
        caller.backward_with_state(&dy, &x, &w, &saved_caller, g_caller.as_mut(), &mut state).unwrap();
        assert_grads_bits(&format!("t={t}"), &g_caller, &g_own);
        assert_bits(&format!("t={t} state after backward"), &state, &own.fp8_state().unwrap());
    }
    assert_ne!(bits(&state), bits(&fresh), "the steps changed no state");
    // the caller plan's own state was never used
    assert_bits("caller plan's own state", &caller.fp8_state().unwrap(), &fresh);
}

#[test]
fn attached_state_matches_the_plan_held_state_and_comes_back() {
    let Some(s) = delayed() else { return };
    let h = s.h;
    let pr = problem::<f32>(&s, 14);
    let w = setup_weights(&pr, &s);
    let mut own = s.builder::<f32>(MAX_T).build().unwrap();
    let mut att = s.builder::<f32>(MAX_T).build().unwrap();
    let fresh = att.new_fp8_state().unwrap();
    assert_eq!(att.detach_fp8_state().unwrap(), None); // nothing attached yet
    att.attach_fp8_state(fresh.clone()).unwrap();
    for (t, k) in STEPS {
        let x = scaled(&pr.x[..t * h], k);
        let dy = scaled(&pr.dy[..t * h], 1.0 / k);
        let (y_own, saved_own) = own.forward_alloc(&x, &w).unwrap();
        let (y_att, saved_att) = att.forward_alloc(&x, &w).unwrap();
        assert_bits(&format!("t={t} y"), &y_att, &y_own);
        let g_own = own.backward(&dy, &x, &w, &saved_own).unwrap();
        let g_att = att.backward(&dy, &x, &w, &saved_att).unwrap();
        assert_grads_bits(&format!("t={t}"), &g_att, &g_own);
        let want = own.fp8_state().unwrap();
        assert_bits(&format!("t={t} attached"), att.attached_fp8_state().unwrap(), &want);
        assert_bits(&format!("t={t} read through the plan"), &att.fp8_state().unwrap(), &want);
    }
    #[cfg(feature = "experimental")]
    assert_eq!(att.export_state().unwrap(), own.export_state().unwrap());

    // the state functions write the attached array
    att.set_quantizer_state(Quantizer::W1, 2.0, &[4.0, 3.0, 2.0, 1.0]).unwrap();
    let row = &att.attached_fp8_state().unwrap()[(1 + HIST)..][..1 + HIST];
    assert_eq!(row, &[2.0, 4.0, 3.0, 2.0, 1.0]);
    // and the next call reads what is written into it
    att.attached_fp8_state_mut().unwrap()[0] = 0.5;
    assert_eq!(att.quantizer_state(Quantizer::LnOut).unwrap().scale, 0.5);

    // detaching gives the array back; the plan's own state was kept (fresh)
    let back = att.detach_fp8_state().unwrap().unwrap();
    assert_eq!(back[0], 0.5);
    assert_eq!(back[1 + HIST], 2.0);
    assert!(att.attached_fp8_state().is_none());
    assert_bits("own state after detach", &att.fp8_state().unwrap(), &fresh);

    // a per-call state overrides an attached one, which the call leaves alone
    att.attach_fp8_state(back.clone()).unwrap();
    let mut other = fresh.clone();
    let x = &pr.x[..3 * h];
    att.forward_with_state(x, &w, &mut vec![0.0; 3 * h], &mut att.new_saved().unwrap(), &mut other).unwrap();
    assert_ne!(bits(&other), bits(&fresh));
    assert_bits("attached, untouched", att.attached_fp8_state().unwrap(), &back);
    drop(att); // frees the attached array after the plan
}

#[test]
fn fp8_state_misuse_is_an_error() {
    let Some(s) = delayed() else { return };
    let pr = problem::<f32>(&s, 15);
    let w = setup_weights(&pr, &s);
    let mut plan = s.builder::<f32>(MAX_T).build().unwrap();
    let len = plan.fp8_state_len();
    let e = plan.attach_fp8_state(vec![1.0; len - 1]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("fp8_state has 29 elements, but the plan needs"), "{e}");
    assert!(plan.attached_fp8_state().is_none());
    let x = &pr.x[..2 * s.h];
    let mut y = vec![0.0; 2 * s.h];
    let e =
        plan.forward_with_state(x, &w, &mut y, &mut plan.new_saved().unwrap(), &mut vec![1.0; len + 1]).unwrap_err();
    assert!(e.message().starts_with("fp8_state has 31 elements"), "{e}");

    // a stateless plan takes no state
    let mut none = ln_gelu().builder::<f32>(MAX_T).build().unwrap();
    let e = none.attach_fp8_state(vec![1.0; len]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("keeps no quantizer state"), "{e}");
    let e = none.forward_with_state(x, &w, &mut y, &mut none.new_saved().unwrap(), &mut vec![1.0; len]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("fp8_state was given"), "{e}");
    let e = none.detach_fp8_state().unwrap_err(); // the library's answer
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
}
