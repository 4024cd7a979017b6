//! fp32 master weights of a bf16 / f16 plan (`lnmlp_desc_set_weight_dtype`, through
//! `PlanBuilder::weight_dtype` and `Weights<T, W>`): accepted only with an FP8 recipe, reported by
//! the shape query, and checked before each call.
mod common;

use common::*;
use lnmlp::*;

const MAX_T: usize = 8;
const H: usize = 16;
const F: usize = 24;

fn builder(recipe: Recipe) -> PlanBuilder {
    layernorm_gelu(MAX_T, H, F).dtype(DType::Bf16).recipe(recipe)
}

fn current_supported() -> bool {
    let ok = query_support(Backend::Cpu, Feature::RecipeCurrent).unwrap().is_available();
    if !ok {
        eprintln!("skipped: current scaling not supported here");
    }
    ok
}

fn bf16s(v: &[f64]) -> Vec<Bf16> {
    v.iter().map(|&x| Bf16::from_f32(x as f32)).collect()
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// The inputs and parameters of the plan's most tokens, as f64.
fn problem(seed: u64) -> Problem<f64> {
    Problem::draw(seed, MAX_T, H, F, 1, |x| x)
}

fn max_abs<T: Element>(v: &[T]) -> f32 {
    v.iter().map(|x| x.to_f32().abs()).fold(0.0, f32::max)
}

fn assert_finite<T: Element>(what: &str, v: &[T]) {
    assert!(v.iter().all(|x| x.to_f32().is_finite()), "{what} has a non-finite value");
    assert!(max_abs(v) > 0.0, "{what} is all zeros");
}

#[test]
fn the_weight_dtype_defaults_to_the_io_dtype() {
    let p = builder(Recipe::None).build().unwrap();
    assert_eq!(p.weight_dtype(), DType::Bf16);
    assert_eq!(p.tensor_shape(Tensor::W1, Tokens::Max).unwrap().unwrap().element_type(), ElementType::Bf16);
    // the I/O dtype itself is accepted without a recipe, on an f32 plan too
    let p = builder(Recipe::None).weight_dtype(DType::Bf16).build().unwrap();
    assert_eq!(p.weight_dtype(), DType::Bf16);
    let p = PlanBuilder::new().shape(4, 8, 16).weight_dtype(DType::F32).build().unwrap();
    assert_eq!((p.dtype(), p.weight_dtype()), (DType::F32, DType::F32));
}

#[test]
fn f32_weights_need_an_fp8_recipe() {
    let e = builder(Recipe::None).weight_dtype(DType::F32).build().unwrap_err();
    assert_eq!(e.status(), Status::NotSupported, "{e}");
    assert!(e.message().contains("FP8 recipe"), "{e}");
}

#[test]
fn a_bad_weight_dtype_is_refused_at_build() {
    for (io, wt) in [(DType::Bf16, DType::F16), (DType::F16, DType::Bf16), (DType::F32, DType::Bf16)] {
        let e = PlanBuilder::new().shape(4, 8, 16).dtype(io).weight_dtype(wt).recipe(Recipe::Current).build();
        let e = e.unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{io:?}/{wt:?}: {e}");
        assert!(e.message().contains("weight"), "{e}");
    }
}

/// A bf16 plan under current scaling with fp32 W1 and W2: the shape query reports them f32 (the
/// other parameters and the gradients stay bf16), forward and backward run on `Weights<Bf16,
/// f32>`, and the results are finite and near those of the same plan fed the weights rounded to
/// bf16.
#[test]
fn a_bf16_fp8_plan_runs_on_f32_weights() {
    if !current_supported() {
        return;
    }
    let pr = problem(21);
    let mut plan = builder(Recipe::Current).weight_dtype(DType::F32).build().unwrap();
    assert_eq!((plan.dtype(), plan.weight_dtype(), plan.grad_dtype()), (DType::Bf16, DType::F32, DType::Bf16));
    let et = |t| plan.tensor_shape(t, Tokens::Max).unwrap().unwrap().element_type();
    assert_eq!((et(Tensor::W1), et(Tensor::W2)), (ElementType::F32, ElementType::F32));
    assert_eq!(
        (et(Tensor::B1), et(Tensor::Gamma), et(Tensor::DW1)),
        (ElementType::Bf16, ElementType::Bf16, ElementType::Bf16)
    );

    let (gamma, beta, b1, b2) = (bf16s(&pr.gamma), bf16s(&pr.beta), bf16s(&pr.b1), bf16s(&pr.b2));
    let (w1, w2) = (f32s(&pr.w1), f32s(&pr.w2));
    let w = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: Some(&b1), w2: &w2, b2: Some(&b2) };
    let t = 5;
    let (x, dy) = (bf16s(&pr.x[..t * H]), bf16s(&pr.dy[..t * H]));
    let (y, saved) = plan.forward_alloc(&x, &w).unwrap();
    let g = plan.backward(&dy, &x, &w, &saved).unwrap();
    assert_finite("y", &y);
    assert_finite("dx", &g.dx);
    assert_finite("dgamma", &g.dgamma);
    assert_finite("dbeta", g.dbeta.as_ref().unwrap());
    assert_finite("dw1", &g.dw1);
    assert_finite("db1", g.db1.as_ref().unwrap());
    assert_finite("dw2", &g.dw2);
    assert_finite("db2", g.db2.as_ref().unwrap());

    // The same plan with bf16 weights (the default weight dtype).
    let mut p16 = builder(Recipe::Current).build().unwrap();
    let (w1b, w2b) = (bf16s(&pr.w1), bf16s(&pr.w2));
    let wb = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1b, b1: Some(&b1), w2: &w2b, b2: Some(&b2) };
    let (y16, saved16) = p16.forward_alloc(&x, &wb).unwrap();
    let g16 = p16.backward(&dy, &x, &wb, &saved16).unwrap();
    // The two round W1 / W2 to FP8 from slightly different values, so an element may land one FP8
    // step (E4M3: 2^-3 relative) apart; misread weights would be far off.
    let close = |what: &str, a: &[Bf16], b: &[Bf16]| {
        let d = a.iter().zip(b).map(|(p, q)| (p.to_f32() - q.to_f32()).abs()).fold(0.0, f32::max);
        assert!(d <= 0.25 * max_abs(b), "{what}: max difference {d} vs max {}", max_abs(b));
    };
    close("y", &y, &y16);
    close("dx", &g.dx, &g16.dx);
    close("dw1", &g.dw1, &g16.dw1);
    close("dw2", &g.dw2, &g16.dw2);
}

/// bf16 W1 / W2 given to a plan that takes f32 ones are refused before the library is called.
#[test]
fn a_bf16_weight_slice_is_refused_by_an_f32_weight_plan() {
    if !current_supported() {
        return;
    }
    let pr = problem(22);
    let mut plan = builder(Recipe::Current).weight_dtype(DType::F32).build().unwrap();
    let (gamma, beta, b1, b2) = (bf16s(&pr.gamma), bf16s(&pr.beta), bf16s(&pr.b1), bf16s(&pr.b2));
    let (w1, w2) = (bf16s(&pr.w1), bf16s(&pr.w2));
    let wrong: Weights<'_, Bf16> =
        Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: Some(&b1), w2: &w2, b2: Some(&b2) };
    let (w1f, w2f) = (f32s(&pr.w1), f32s(&pr.w2));
    let right = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1f, b1: Some(&b1), w2: &w2f, b2: Some(&b2) };
    let t = 3;
    let (x, dy) = (bf16s(&pr.x[..t * H]), bf16s(&pr.dy[..t * H]));
    let saved = plan.forward_alloc(&x, &right).unwrap().1;

    // Leave a known library message, then show the checks below never reach the library.
    let first = PlanBuilder::new().shape(0, 1, 1).build().unwrap_err();
    let before = last_error();
    assert_eq!(before, first.message());

    let e = plan.forward_alloc(&x, &wrong).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("w1 is Bf16, but this plan's weights W1, W2 are F32"), "{e}");
    assert!(e.message().contains("Weights::<Bf16, f32>"), "{e}");
    let e = plan.backward(&dy, &x, &wrong, &saved).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("w1 is Bf16"), "{e}");
    assert_eq!(last_error(), before, "a check reached the library");

    // and f32 weights to a plan that takes bf16 ones
    let mut p16 = builder(Recipe::Current).build().unwrap();
    let e = p16.forward_alloc(&x, &right).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("w1 is F32, but this plan's weights W1, W2 are Bf16"), "{e}");
    assert_eq!(last_error(), before, "a check reached the library");
}
