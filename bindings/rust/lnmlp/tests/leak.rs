//! Drop frees the plan: repeated create/drop (each plan owning a sizeable workspace) does not
//! grow the process's resident memory. Its own test binary, so no other test allocates meanwhile.
use lnmlp::*;

fn rss_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn repeated_create_and_drop_does_not_leak() {
    let build =
        || PlanBuilder::new().shape(256, 256, 1024).activation(Activation::Gelu).num_threads(1).build().unwrap();
    let per_plan = {
        let p = build();
        p.workspace_bytes() + p.saved_bytes()
    };
    let x = vec![0.5f32; 256 * 256];
    let (g, b) = (vec![1.0f32; 256], vec![0.0f32; 256]);
    let w1 = vec![0.01f32; 256 * 1024];
    let w2 = vec![0.01f32; 1024 * 256];
    let w = Weights { gamma: &g, beta: Some(&b), w1: &w1, b1: None, w2: &w2, b2: None };
    let mut y = vec![0.0f32; 256 * 256];
    // warm up (allocator pools, BLAS buffers), then measure
    for _ in 0..5 {
        let mut p = build();
        let _saved = p.forward(&x, &w, &mut y).unwrap();
    }
    let Some(before) = rss_bytes() else {
        eprintln!("skipped: no /proc/self/statm");
        return;
    };
    let n = 200;
    for _ in 0..n {
        let mut p = build();
        let _saved = p.forward(&x, &w, &mut y).unwrap(); // touches the workspace and saved
    }
    let after = rss_bytes().unwrap();
    let grown = after.saturating_sub(before);
    eprintln!("per plan {per_plan} bytes; RSS grew {grown} bytes over {n} plans");
    // A leak of the plan's memory would grow RSS by ~n * per_plan; allow a small fraction.
    assert!(grown < (n * per_plan) / 10, "RSS grew {grown} bytes over {n} create/drop cycles ({per_plan} bytes each)");
}
