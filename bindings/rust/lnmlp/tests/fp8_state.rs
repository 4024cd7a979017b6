//! Delayed scaling: the plan's quantizer state after a step, and (experimental) export/import.
use lnmlp::*;

const HIST: usize = 4;

fn plan() -> Plan {
    PlanBuilder::new()
        .shape(4, 32, 64)
        .activation(Activation::Gelu)
        .recipe(Recipe::Delayed)
        .delayed_scaling(DelayedScaling { margin: 0, amax_history_len: HIST, amax_compute_algo: AmaxAlgo::Max })
        .build()
        .unwrap()
}

fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

#[test]
fn delayed_scaling_state_after_a_step() {
    if !query_support(Backend::Cpu, Feature::RecipeDelayed).unwrap().is_available() {
        eprintln!("skipped: delayed scaling not supported here");
        return;
    }
    let mut p = plan();
    assert_eq!(p.amax_history_length(), HIST);
    // initial state: scale 1, zero history
    for q in Quantizer::ALL {
        let s = p.quantizer_state(q).unwrap();
        assert_eq!(s, QuantizerState { scale: 1.0, amax_history: vec![0.0; HIST] }, "{q:?}");
    }
    let (t, h, f) = (4, 32, 64);
    let v = |n: usize, s: f32, k: f32| (0..n).map(|i| ((i as f32 + 1.0) * s).sin() * k).collect::<Vec<f32>>();
    let x = v(t * h, 0.7, 3.0);
    let (gamma, beta) = (vec![1.0f32; h], vec![0.0f32; h]);
    let (w1, w2) = (v(h * f, 0.3, 0.2), v(f * h, 0.9, 0.1));
    let w = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: None, w2: &w2, b2: None };
    let mut y = vec![0.0f32; t * h];
    let saved = p.forward(&x, &w, &mut y).unwrap();

    // W1 and W2 are inputs: their amax is exact; the forward quantizers use E4M3 (max 448)
    for (q, wt) in [(Quantizer::W1, &w1), (Quantizer::W2, &w2)] {
        let s = p.quantizer_state(q).unwrap();
        assert_eq!(s.amax_history[0], amax(wt), "{q:?}");
        assert!(s.amax_history[1..].iter().all(|&a| a == 0.0));
        let want = 448.0 / amax(wt);
        assert!((s.scale - want).abs() <= want * 1e-6, "{q:?}: scale {} want {want}", s.scale);
    }
    // LnOut: layernorm with gamma 1, beta 0 gives rows of mean 0, variance ~1: amax in (1, sqrt(H))
    let s = p.quantizer_state(Quantizer::LnOut).unwrap();
    assert!(s.amax_history[0] > 1.0 && s.amax_history[0] < (h as f32).sqrt(), "{s:?}");
    assert!((s.scale - 448.0 / s.amax_history[0]).abs() <= s.scale * 1e-6);
    // backward quantizers untouched by forward
    assert_eq!(p.quantizer_state(Quantizer::Dy).unwrap().scale, 1.0);

    let dy = v(t * h, 0.41, 2.0);
    p.backward(&dy, &x, &w, &saved).unwrap();
    let s = p.quantizer_state(Quantizer::Dy).unwrap();
    assert_eq!(s.amax_history[0], amax(&dy));
    let want = 57344.0 / amax(&dy); // HYBRID: gradients in E5M2
    assert!((s.scale - want).abs() <= want * 1e-6, "dy scale {} want {want}", s.scale);
    assert!(p.quantizer_state(Quantizer::Dh).unwrap().amax_history[0] > 0.0);

    #[cfg(feature = "experimental")]
    export_import(&p);

    // set_quantizer_state: checked length, library-validated values
    let mut r = plan();
    let e = r.set_quantizer_state(Quantizer::W1, 2.0, &[1.0; HIST + 1]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = r.set_quantizer_state(Quantizer::W1, -2.0, &[1.0; HIST]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    r.set_quantizer_state(Quantizer::W1, 2.0, &[4.0, 3.0, 2.0, 1.0]).unwrap();
    assert_eq!(
        r.quantizer_state(Quantizer::W1).unwrap(),
        QuantizerState { scale: 2.0, amax_history: vec![4.0, 3.0, 2.0, 1.0] }
    );
}

/// The state blob (experimental): a round trip of `p`'s state, bit for bit; bad blobs rejected.
#[cfg(feature = "experimental")]
fn export_import(p: &Plan) {
    assert_eq!(p.state_bytes(), 8 + 4 * 4 + 6 * (4 + 4 * HIST));
    let blob = p.export_state().unwrap();
    assert_eq!(blob.len(), p.state_bytes());
    assert_eq!(&blob[..8], b"LNMLPQS1");
    let mut q = plan();
    q.import_state(&blob).unwrap();
    assert_eq!(q.export_state().unwrap(), blob);
    for qq in Quantizer::ALL {
        assert_eq!(q.quantizer_state(qq).unwrap(), p.quantizer_state(qq).unwrap());
    }

    // a bad blob is rejected and changes nothing
    let fresh = plan().export_state().unwrap();
    let mut r = plan();
    for bad in [&blob[..blob.len() - 1], &[][..]] {
        let e = r.import_state(bad).unwrap_err();
        assert!(!e.message().is_empty(), "{e}");
    }
    let mut corrupt = blob.clone();
    corrupt[0] = b'X';
    let e = r.import_state(&corrupt).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let mut negative_scale = blob.clone();
    negative_scale[24..28].copy_from_slice(&(-1.0f32).to_ne_bytes()); // first quantizer's scale
    let e = r.import_state(&negative_scale).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert_eq!(r.export_state().unwrap(), fresh);
    // another history length
    let mut other = PlanBuilder::new()
        .shape(4, 32, 64)
        .activation(Activation::Gelu)
        .recipe(Recipe::Delayed)
        .delayed_scaling(DelayedScaling { amax_history_len: 8, ..Default::default() })
        .build()
        .unwrap();
    assert!(other.import_state(&blob).is_err());
}

#[test]
fn nvfp4_draws_from_the_plans_random_state() {
    assert_eq!(query_support(Backend::Cpu, Feature::RecipeNvfp4).unwrap(), Support::Emulated);
    let (t, h, f) = (32, 32, 64);
    let v = |n: usize, s: f32, k: f32| (0..n).map(|i| ((i as f32 + 1.0) * s).sin() * k).collect::<Vec<f32>>();
    let x = v(t * h, 0.7, 3.0);
    let (gamma, beta) = (vec![1.0f32; h], vec![0.0f32; h]);
    let (w1, w2) = (v(h * f, 0.3, 0.2), v(f * h, 0.9, 0.1));
    let w = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: None, w2: &w2, b2: None };
    let dy = v(t * h, 0.41, 2.0);
    let build = |no_sr: bool| {
        PlanBuilder::new()
            .shape(t, h, f)
            .activation(Activation::Gelu)
            .recipe(Recipe::Nvfp4)
            .nvfp4_options(false, no_sr, false)
            .build()
            .unwrap()
    };
    let mut p = build(false);
    assert_eq!(p.rng_state().unwrap(), (0, 0));
    let seed = u64::MAX - 5; // the full 64 bits travel
    p.set_rng_state(seed, 9).unwrap();
    let mut y = vec![0.0f32; t * h];
    let saved = p.forward(&x, &w, &mut y).unwrap();
    let first = p.backward(&dy, &x, &w, &saved).unwrap();
    assert_eq!(p.rng_state().unwrap(), (seed, 10), "a backward that draws moves the offset on");
    p.set_rng_state(seed, 9).unwrap();
    let again = p.backward(&dy, &x, &w, &saved).unwrap();
    assert_eq!(first.dw1, again.dw1, "the same random state draws the same bits");
    // Placed further on in a whole tensor (a split done by the caller): other bits; placed back,
    // the first ones.
    p.set_rng_place(32, 128, 0, 1).unwrap();
    p.set_rng_state(seed, 9).unwrap();
    assert_ne!(p.backward(&dy, &x, &w, &saved).unwrap().dw1, first.dw1);
    p.set_rng_place(0, 0, 0, 1).unwrap();
    p.set_rng_state(seed, 9).unwrap();
    assert_eq!(p.backward(&dy, &x, &w, &saved).unwrap().dw1, first.dw1);
    assert!(p.set_rng_place(0, 0, 0, 0).is_err(), "no F parts");
    let mut rtne = build(true);
    let saved = rtne.forward(&x, &w, &mut y).unwrap();
    rtne.backward(&dy, &x, &w, &saved).unwrap();
    assert_eq!(rtne.rng_state().unwrap(), (0, 0), "without stochastic rounding nothing is drawn");
}
