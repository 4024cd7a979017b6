//! Conversions, queries and every error path the safe API can trigger.
use lnmlp::*;

fn small() -> PlanBuilder {
    PlanBuilder::new().shape(2, 8, 16).activation(Activation::Gelu).bias(true, false)
}

struct Bufs {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
}

fn bufs(t: usize, h: usize, f: usize) -> Bufs {
    let v = |n: usize, s: f32| (0..n).map(|i| ((i as f32 + 1.0) * s).sin()).collect::<Vec<f32>>();
    Bufs {
        x: v(t * h, 0.7),
        gamma: vec![1.0; h],
        beta: vec![0.0; h],
        w1: v(h * f, 0.3),
        b1: v(f, 0.5),
        w2: v(f * h, 0.9),
    }
}

impl Bufs {
    fn weights(&self) -> Weights<'_, f32> {
        Weights { gamma: &self.gamma, beta: Some(&self.beta), w1: &self.w1, b1: Some(&self.b1), w2: &self.w2, b2: None }
    }
}

#[test]
fn version_build_info_and_support() {
    let v = version();
    assert_eq!(v.abi, ffi::LNMLP_ABI_VERSION);
    assert_eq!((v.major, v.minor), (ffi::LNMLP_VERSION_MAJOR, ffi::LNMLP_VERSION_MINOR));
    assert!(!build_info().is_empty());
    assert!(query_support(Backend::Cpu, Feature::Backend).unwrap().is_available());
    assert!(query_support(Backend::Cpu, Feature::DTypeBf16).unwrap().is_available());
    // The three-way answer: the CPU backend emulates every FP8 recipe exactly.
    assert_eq!(query_support(Backend::Cpu, Feature::DTypeF32).unwrap(), Support::Supported);
    for recipe in [Feature::RecipeDelayed, Feature::RecipeCurrent, Feature::RecipeBlock, Feature::RecipeMxfp8] {
        assert_eq!(query_support(Backend::Cpu, recipe).unwrap(), Support::Emulated, "{recipe:?}");
    }
    assert_eq!(status_string(ffi::LNMLP_ERROR_NULL_POINTER), "LNMLP_ERROR_NULL_POINTER");
    assert_eq!(Status::from_code(7), Status::WorkspaceTooSmall);
    assert_eq!(Status::PlanBusy.code(), ffi::LNMLP_ERROR_PLAN_BUSY);
}

/// Every 16-bit pattern survives pattern -> f32 -> pattern (NaNs stay NaN).
fn every_pattern_round_trips<E: Element>(from_bits: fn(u16) -> E, to_bits: fn(E) -> u16) {
    for bits in 0u16..=u16::MAX {
        let f = from_bits(bits).to_f32();
        if f.is_nan() {
            assert!(E::from_f32(f).to_f32().is_nan());
            continue;
        }
        assert_eq!(to_bits(E::from_f32(f)), bits, "{:?} {bits:#06x} = {f}", E::DTYPE);
    }
}

#[test]
fn bf16_conversions_round_trip_and_round_to_nearest_even() {
    every_pattern_round_trips::<Bf16>(Bf16::from_bits, Bf16::to_bits);
    assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
    // 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties to even (1.0)
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).0, 0x3f80);
    // 1 + 3*2^-8 is between 1+2^-7 (odd) and 1+2^-6: ties to even (up)
    assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).0, 0x3f82);
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0 + 1e-6).0, 0x3f81); // above the tie: up
    assert_eq!(Bf16::from_f32(f32::MAX).to_f32(), f32::INFINITY); // overflow rounds to inf
    assert_eq!(Bf16::from_f32(-0.0).0, 0x8000);
    assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    let x: f32 = 2.71;
    assert!((f32::from(Bf16::from(x)) - x).abs() <= x * 2f32.powi(-8)); // half an ulp: 2^-8 of the binade's base <= x
}

#[test]
fn f16_conversions_round_trip_and_round_to_nearest_even() {
    every_pattern_round_trips::<F16>(F16::from_bits, F16::to_bits);
    assert_eq!(F16::from_f32(1.0).0, 0x3c00);
    assert_eq!(F16::from_f32(65504.0).0, 0x7bff);
    assert_eq!(F16::from_f32(65520.0).0, 0x7c00); // the tie above max rounds to inf
    assert_eq!(F16::from_f32(2f32.powi(-24)).0, 0x0001); // smallest subnormal
    assert_eq!(F16::from_f32(2f32.powi(-25)).0, 0x0000); // its half ties to even (0)
    assert_eq!(F16::from_f32(3.0 * 2f32.powi(-25)).0, 0x0002); // 1.5 ulp ties to even (2)
    assert_eq!(F16::from_f32(1.0 + 2f32.powi(-11)).0, 0x3c00); // tie, to even
}

#[test]
fn fp8_encode_decode() {
    let v = [0.0f32, 1.0, -2.5, 448.0, 1000.0, f32::NAN];
    let codes = fp8_encode(Fp8Encoding::E4M3, &v, 1.0).unwrap();
    assert_eq!(codes[1], 0x38);
    assert_eq!(codes[5] & 0x7f, 0x7f);
    let back = fp8_decode(Fp8Encoding::E4M3, &codes, 1.0).unwrap();
    assert_eq!(&back[..4], &[0.0, 1.0, -2.5, 448.0]);
    assert_eq!(back[4], 448.0); // saturates
    assert!(back[5].is_nan());
    let e5 = fp8_encode(Fp8Encoding::E5M2, &[1e9], 1.0).unwrap();
    assert_eq!(fp8_decode(Fp8Encoding::E5M2, &e5, 1.0).unwrap()[0], Fp8Encoding::E5M2.max_finite());
    let err = fp8_encode(Fp8Encoding::E4M3, &v, 0.0).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(!err.message().is_empty());
    // The element types are LNMLP_DTYPE_FP8_* (4, 5); ABI 1's LNMLP_FP8_* numbers (0, 1) are refused.
    assert_eq!((Fp8Encoding::E4M3.raw(), Fp8Encoding::E5M2.raw()), (4, 5));
    let mut out = [0u8; 1];
    for old in [0, 1] {
        // SAFETY: one input value, one output byte.
        let rc = unsafe { ffi::lnmlp_fp8_encode(old, [1.0f32].as_ptr(), 1, 1.0, out.as_mut_ptr()) };
        assert_eq!(rc, ffi::LNMLP_ERROR_INVALID_ARGUMENT, "dtype {old}");
    }
}

#[test]
fn nvfp4_quantize_dequantize() {
    // Global amax 2688 makes the global scale 1; each block's largest value (6, 6.3) makes its E4M3 scale
    // 1.0 (0x38), so the elements are cast as they are: ties to even, saturation at 6.
    let mut row = [0.0f32; 32];
    row[..8].copy_from_slice(&[6.0, 0.25, 0.75, 2.5, 5.0, -3.0, 6.3, -0.0]);
    row[16] = 6.0;
    row[17] = f32::NAN;
    let q = nvfp4_quantize(&row, 1, 32, false, Some(2688.0)).unwrap();
    // The second block holds a NaN: its amax is NaN, its scale saturates to 448 (0x7e).
    assert_eq!(q.scales, vec![0x38, 0x7e]);
    // codes: 6 -> 7, 0.25 -> 0, 0.75 -> 2 (1.0), 2.5 -> 4 (2.0), 5 -> 6 (4.0), -3 -> 13, 6.3 -> 7, -0 -> 8
    assert_eq!(&q.codes[..4], &[0x07, 0x42, 0xd6, 0x87]);
    assert_eq!(q.codes[8], 0x70); // 6 at scale 448 -> 0, the NaN -> +6 (code 7)
    let back = nvfp4_dequantize(&q).unwrap();
    assert_eq!(&back[..8], &[6.0, 0.0, 1.0, 2.0, 4.0, -3.0, 6.0, -0.0]);
    assert_eq!(nvfp4_quantize(&row[..16], 1, 16, true, None).unwrap().global_amax, 6.3);
    assert!(nvfp4_quantize(&row, 1, 32, false, None).unwrap().global_amax.is_nan());
    let err = nvfp4_quantize(&row, 2, 32, false, None).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    let err = nvfp4_quantize(&row, 1, 32, false, Some(-1.0)).unwrap_err();
    assert!(err.message().contains("global_amax"), "{}", err.message());
}

#[test]
fn bad_shape_is_invalid_argument_with_the_library_message() {
    let err = PlanBuilder::new().shape(0, 8, 16).build().unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(!err.message().is_empty(), "no message");
    assert_eq!(err.message(), last_error());
    let shown = err.to_string();
    assert!(shown.starts_with("LNMLP_ERROR_INVALID_ARGUMENT: "), "{shown}");
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
    assert!(!boxed.to_string().is_empty());
    // no shape at all
    assert!(PlanBuilder::new().build().is_err());
}

#[test]
fn bad_settings_are_reported() {
    let e = small().epsilon(-1.0).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = small().activation_name("not_an_activation").build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("not_an_activation"), "{e}");
    let e = small().gated(Activation::ClampedSilu, Activation::Linear).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = small().backend(Backend::Cpu, 3).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = small().clamped_swiglu(ClampedSwiglu { limit: -1.0, ..Default::default() }).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // the valid ones build
    let p = small()
        .activation_name("clamped_swiglu")
        .clamped_swiglu(ClampedSwiglu::default())
        .recipe(Recipe::Current)
        .fp8_format(Fp8Format::E4M3)
        .scaling_options(Some(true), 0.0)
        .build()
        .unwrap();
    assert_eq!(p.num_activations(), 2);
    assert_eq!((p.group_size(), p.rank(), p.sequence_parallel()), (1, 0, false));
}

#[cfg(feature = "experimental")]
#[test]
fn bad_experimental_settings_are_reported() {
    // a group without a communicator
    let e = small().sharding(2, 0, false).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("communicator"), "{e}");
    // a group of one needs none
    let p = small().sharding(1, 0, false).build().unwrap();
    assert_eq!(p.group_size(), 1);
    if !query_support(Backend::Cuda, Feature::Backend).unwrap().is_available() {
        let e = small().backend(Backend::Cuda, 0).build().unwrap_err();
        assert_eq!(e.status(), Status::NotSupported, "{e}");
    }
    // GEMM math the CPU backend accepts (and computes exactly)
    small().gemm_math(true, true).build().unwrap();
}

#[test]
fn activation_names() {
    assert_eq!(Activations::from_name("swiglu").unwrap(), Activations::Gated(Activation::Silu, Activation::Linear));
    assert_eq!("GeGLU".parse::<Activations>().unwrap(), Activations::Gated(Activation::Gelu, Activation::Linear));
    assert_eq!(Activations::from_name("quick-gelu").unwrap(), Activations::Single(Activation::QuickGelu));
    assert_eq!(
        Activations::from_name("squared_relu, linear").unwrap(),
        Activations::Gated(Activation::SquaredRelu, Activation::Linear)
    );
    assert!(Activations::from_name("a,b,c").is_err());
}

#[test]
fn wrong_lengths_fail_before_the_library_is_called() {
    let mut plan = small().build().unwrap();
    let b = bufs(2, 8, 16);
    // Leave a known library message, then show the checks below never reach the library.
    let first = PlanBuilder::new().shape(0, 1, 1).build().unwrap_err();
    let before = last_error();
    assert_eq!(before, first.message());

    let mut y = vec![0.0f32; 16];
    let w = b.weights();
    let cases: Vec<(&str, Error)> = vec![
        ("x", plan.forward(&b.x[..15], &w, &mut y).unwrap_err()),
        ("y", plan.forward(&b.x, &w, &mut y[..3]).unwrap_err()),
        ("gamma", plan.forward(&b.x, &Weights { gamma: &b.gamma[..7], ..w }, &mut y).unwrap_err()),
        ("w1", plan.forward(&b.x, &Weights { w1: &b.w1[..10], ..w }, &mut y).unwrap_err()),
        ("w2", plan.forward(&b.x, &Weights { w2: &b.b1, ..w }, &mut y).unwrap_err()),
        ("b1", plan.forward(&b.x, &Weights { b1: Some(&b.b1[1..]), ..w }, &mut y).unwrap_err()),
        ("b2", plan.forward(&b.x, &Weights { b2: Some(&b.gamma), ..w }, &mut y).unwrap_err()),
    ];
    for (name, e) in &cases {
        assert_eq!(e.status(), Status::InvalidArgument, "{name}: {e}");
        assert!(e.message().starts_with(name), "{name}: {e}");
    }
    // missing required optional tensors: NullPointer, like the C API
    let e = plan.forward(&b.x, &Weights { beta: None, ..w }, &mut y).unwrap_err();
    assert_eq!(e.status(), Status::NullPointer, "{e}");
    let e = plan.forward(&b.x, &Weights { b1: None, ..w }, &mut y).unwrap_err();
    assert_eq!(e.status(), Status::NullPointer, "{e}");
    // wrong element type
    let xb: Vec<Bf16> = convert_from_f32(&b.x);
    let gb: Vec<Bf16> = convert_from_f32(&b.gamma);
    let mut yb = vec![Bf16::default(); 16];
    let wb = Weights { gamma: &gb, beta: Some(&gb), w1: &gb, b1: None, w2: &gb, b2: None };
    let e = plan.forward(&xb, &wb, &mut yb).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // backward: saved too small, saved of a forward with another token count, wrong dy length,
    // an output of the wrong length
    let saved = plan.forward(&b.x, &w, &mut y).unwrap();
    assert_eq!(saved.tokens(), Some(2));
    let bad = Saved::new(saved.len() - 1, 64).unwrap();
    let e = plan.backward(&y, &b.x, &w, &bad).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().starts_with("saved has"), "{e}");
    let mut y1 = vec![0.0f32; 8];
    let saved1 = plan.forward(&b.x[..8], &w, &mut y1).unwrap();
    let e = plan.backward(&y, &b.x, &w, &saved1).unwrap_err();
    assert!(e.message().starts_with("saved was written by a forward with 1 tokens"), "{e}");
    let e = plan.forward_into(&b.x, &w, &mut y, &mut Saved::new(0, 64).unwrap()).unwrap_err();
    assert!(e.message().starts_with("saved has 0 bytes"), "{e}");
    let e = plan.backward(&y[..4], &b.x, &w, &saved).unwrap_err();
    assert!(e.message().starts_with("dy"), "{e}");
    let mut g = plan.backward(&y, &b.x, &w, &saved).unwrap();
    g.dw2.pop();
    let e = plan.backward_into(&y, &b.x, &w, &saved, g.as_mut()).unwrap_err();
    assert!(e.message().starts_with("dw2"), "{e}");
    // none of these reached the library: its message is still the one from before
    assert_eq!(last_error(), before);

    // a copy of saved (e.g. from a checkpoint) works as the original, and so does a buffer of
    // the plan's full size (larger than a call with fewer tokens needs)
    let copy = Saved::from_bytes(saved.as_bytes(), plan.alignment()).unwrap();
    assert_eq!(copy.tokens(), None);
    let g1 = plan.backward(&y, &b.x, &w, &saved).unwrap();
    let g2 = plan.backward(&y, &b.x, &w, &copy).unwrap();
    assert_eq!(g1, g2);
    let mut full = plan.new_saved().unwrap();
    plan.forward_into(&b.x[..8], &w, &mut y1, &mut full).unwrap();
    assert_eq!(plan.backward(&y1, &b.x[..8], &w, &full).unwrap(), plan.backward(&y1, &b.x[..8], &w, &saved1).unwrap());
}

#[test]
fn external_workspace() {
    let mut plan = small().external_workspace(true).build().unwrap();
    let b = bufs(2, 8, 16);
    let mut y = vec![0.0f32; 16];
    let e = plan.forward(&b.x, &b.weights(), &mut y).unwrap_err();
    assert_eq!(e.status(), Status::NoWorkspace, "{e}");
    assert!(!e.message().is_empty());
    plan.attach_host_workspace().unwrap();
    plan.forward(&b.x, &b.weights(), &mut y).unwrap();
    let mut owned = small().build().unwrap();
    let mut y2 = vec![0.0f32; 16];
    owned.forward(&b.x, &b.weights(), &mut y2).unwrap();
    assert_eq!(y, y2);
}

#[test]
fn stateless_plans_have_no_fp8_state() {
    let plan = small().build().unwrap();
    assert_eq!(plan.amax_history_length(), 0);
    assert_eq!(plan.fp8_state_len(), 0);
    let e = plan.quantizer_state(Quantizer::W1).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    #[cfg(feature = "experimental")]
    {
        let mut plan = plan;
        assert_eq!(plan.state_bytes(), 0);
        assert!(plan.export_state().unwrap().is_empty());
        let e = plan.import_state(b"LNMLPQS1garbage").unwrap_err();
        assert!(!e.message().is_empty(), "{e}");
    }
}

#[test]
fn plan_is_send() {
    let mut plan = small().num_threads(1).build().unwrap();
    let b = bufs(2, 8, 16);
    let mut y0 = vec![0.0f32; 16];
    plan.forward(&b.x, &b.weights(), &mut y0).unwrap();
    let (plan, y1) = std::thread::spawn(move || {
        let mut y = vec![0.0f32; 16];
        plan.forward(&b.x, &b.weights(), &mut y).unwrap();
        (plan, y)
    })
    .join()
    .unwrap();
    assert_eq!(y0, y1);
    drop(plan);
}

#[test]
fn out_of_range_integers_are_refused_not_cut() {
    // A usize above i64::MAX used to reach the library as -1 ("tokens must be >= 1, got -1"); now
    // the builder refuses it with its own message, without calling the library: the thread's
    // last library message stays the one left here.
    let _ = PlanBuilder::new().shape(0, 1, 1).build().unwrap_err();
    let before = last_error();
    let big = i64::MAX as usize + 1;
    let delayed = |len| {
        small().recipe(Recipe::Delayed).delayed_scaling(DelayedScaling { amax_history_len: len, ..Default::default() })
    };
    let cases = vec![
        (small().shape(usize::MAX, 8, 16), "tokens must be in [0, 9223372036854775807], got 18446744073709551615"),
        (small().shape(2, big, 16), "hidden must be in [0, 9223372036854775807], got 9223372036854775808"),
        (small().shape(2, 8, big), "ffn must be in [0, 9223372036854775807], got 9223372036854775808"),
        (small().num_threads(usize::MAX), "num_threads must be in [0, 65536], got 18446744073709551615"),
        (small().num_threads(1 << 32), "num_threads must be in [0, 65536], got 4294967296"),
        (small().num_threads(65537), "num_threads must be in [0, 65536], got 65537"),
        (delayed(big), "amax_history_len must be in [0, 9223372036854775807], got 9223372036854775808"),
    ];
    #[cfg(feature = "experimental")]
    let cases = [
        cases,
        vec![
            (
                small().sharding(usize::MAX, 0, false),
                "group_size must be in [0, 9223372036854775807], got 18446744073709551615",
            ),
            (small().sharding(2, big, false), "rank must be in [0, 9223372036854775807], got 9223372036854775808"),
        ],
    ]
    .concat();
    for (builder, message) in cases {
        let e = builder.build().unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert_eq!(e.message(), message);
    }
    assert_eq!(last_error(), before, "a refused value reached the library");
    // The bounds themselves are the library's to take.
    assert_eq!(small().num_threads(65536).build().unwrap().tokens(), 2);
}

#[test]
fn the_norm_output_is_the_layernorm_of_x() {
    let (t, h, f) = (2, 8, 16);
    let mut b = bufs(t, h, f);
    b.gamma = (0..h).map(|i| 0.5 + 0.1 * i as f32).collect();
    b.beta = (0..h).map(|i| 0.05 * i as f32 - 0.2).collect();
    let mut y = vec![0.0f32; t * h];
    // The float64 layernorm of x (epsilon 1e-6, the default), rounded once to f32.
    let (gamma, beta) = (&b.gamma, &b.beta);
    let want: Vec<f32> =
        b.x.chunks(h)
            .flat_map(|row| {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / h as f64;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
                let rs = 1.0 / (var + 1e-6).sqrt();
                (0..h)
                    .map(move |j| ((row[j] as f64 - mean) * rs * gamma[j] as f64 + beta[j] as f64) as f32)
                    .collect::<Vec<_>>()
            })
            .collect();
    for remat in [Remat::SaveAll, Remat::SaveStats, Remat::ForwardOnly] {
        let mut plan = small().remat(remat).norm_output(true).build().unwrap();
        let saved = plan.forward(&b.x, &b.weights(), &mut y).unwrap();
        let ln = plan.norm_output::<f32>(&saved).unwrap();
        assert_eq!(ln.len(), t * h);
        for (g, w) in ln.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{remat:?}: {g} against {w}");
        }
    }
    // A plan that does not give it, and the wrong element type, are refused.
    let mut plain = small().remat(Remat::SaveStats).build().unwrap();
    let saved = plain.forward(&b.x, &b.weights(), &mut y).unwrap();
    assert_eq!(plain.norm_output::<f32>(&saved).unwrap_err().status(), Status::InvalidArgument);
    let mut plan = small().norm_output(true).build().unwrap();
    let saved = plan.forward(&b.x, &b.weights(), &mut y).unwrap();
    assert_eq!(plan.norm_output::<Bf16>(&saved).unwrap_err().status(), Status::InvalidArgument);
}
