//! Sharded plans through the safe `Communicator`: P ranks as P threads of this process over an
//! in-process `Collectives` implementation (shared buffers and a barrier, like the C++ tests'
//! tests/sharding_util.h), the group's assembled outputs and gradients against the unsharded
//! plan, with and without sequence parallelism; and the error paths. Experimental: built only
//! with the `experimental` feature.
#![cfg(feature = "experimental")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use common::*;
use lnmlp::{
    Activation, Collectives, CommResult, Communicator, ElementType, Gradients, Norm, PlanBuilder, Remat, Status,
    Weights,
};

// ---- the in-process group -------------------------------------------------------------------------

/// What the P ranks share: one slot per rank for each collective's contribution, and a barrier.
struct Shared {
    p: usize,
    barrier: Barrier,
    bytes: Mutex<Vec<Vec<u8>>>,
    floats: Mutex<Vec<Vec<f32>>>,
    calls: AtomicUsize,
}

/// One rank's view. Each collective publishes a copy of this rank's contribution, waits for every
/// rank, computes its result from all of them (sums in rank order: the same bits everywhere),
/// and waits again so no slot is overwritten by the next collective while another rank reads it.
struct Rank {
    g: Arc<Shared>,
    rank: usize,
}

fn group(p: usize) -> Vec<Rank> {
    let g = Arc::new(Shared {
        p,
        barrier: Barrier::new(p),
        bytes: Mutex::new(vec![Vec::new(); p]),
        floats: Mutex::new(vec![Vec::new(); p]),
        calls: AtomicUsize::new(0),
    });
    (0..p).map(|rank| Rank { g: g.clone(), rank }).collect()
}

impl Rank {
    fn reduce(&self, contribution: &[f32], out: &mut [f32], offset: usize, op: fn(f32, f32) -> f32) {
        if self.rank == 0 {
            self.g.calls.fetch_add(1, Ordering::Relaxed);
        }
        self.g.floats.lock().unwrap()[self.rank] = contribution.to_vec();
        self.g.barrier.wait();
        {
            let s = self.g.floats.lock().unwrap();
            for (i, o) in out.iter_mut().enumerate() {
                let at = offset + i;
                *o = s[1..].iter().fold(s[0][at], |v, q| op(v, q[at]));
            }
        }
        self.g.barrier.wait();
    }
}

impl Collectives for Rank {
    fn size(&self) -> usize {
        self.g.p
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_gather(&self, data: &mut [u8], _ty: ElementType) -> CommResult {
        let n = data.len() / self.g.p;
        self.g.bytes.lock().unwrap()[self.rank] = data[self.rank * n..][..n].to_vec();
        self.g.barrier.wait();
        {
            let s = self.g.bytes.lock().unwrap();
            for (q, part) in s.iter().enumerate() {
                data[q * n..][..n].copy_from_slice(part);
            }
        }
        self.g.barrier.wait();
        Ok(())
    }
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult {
        self.reduce(send, recv, self.rank * recv.len(), |a, b| a + b);
        Ok(())
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> CommResult {
        let mine = data.to_vec();
        self.reduce(&mine, data, 0, |a, b| a + b);
        Ok(())
    }
    fn all_reduce_max(&self, data: &mut [f32]) -> CommResult {
        let mine = data.to_vec();
        self.reduce(&mine, data, 0, f32::max);
        Ok(())
    }
}

// ---- the problem, its shards, and the assembled group result ------------------------------------

struct Problem {
    t: usize,
    h: usize,
    f: usize,
    a: usize,
    x: Vec<f32>,
    dy: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

fn f32s(v: Vec<f64>) -> Vec<f32> {
    v.into_iter().map(|x| x as f32).collect()
}

fn problem(t: usize, h: usize, f: usize, a: usize, seed: u64) -> Problem {
    let mut r = Rng::new(seed);
    Problem {
        t,
        h,
        f,
        a,
        x: f32s(r.vec(t * h, 2.0)),
        dy: f32s(r.vec(t * h, 1.0)),
        gamma: f32s(r.vec(h, 0.5).iter().map(|v| v + 1.0).collect()),
        beta: f32s(r.vec(h, 0.2)),
        w1: f32s(r.vec(h * a * f, 1.0 / (h as f64).sqrt())),
        b1: f32s(r.vec(a * f, 0.2)),
        w2: f32s(r.vec(f * h, 1.0 / (f as f64).sqrt())),
        b2: f32s(r.vec(h, 0.2)),
    }
}

/// Columns c0..c0+nc of each row of a row-major [rows, width] matrix.
fn cols(m: &[f32], width: usize, c0: usize, nc: usize) -> Vec<f32> {
    m.chunks(width).flat_map(|row| row[c0..c0 + nc].iter().copied()).collect()
}

/// Writes `part` [rows, nc] into columns c0.. of `m` [rows, width].
fn put_cols(m: &mut [f32], part: &[f32], width: usize, c0: usize, nc: usize) {
    for (row, p) in m.chunks_mut(width).zip(part.chunks(nc)) {
        row[c0..c0 + nc].copy_from_slice(p);
    }
}

struct Setup {
    norm: Norm,
    gated: bool,
    bias: bool,
    remat: Remat,
}

/// A plan for `max_t` tokens (at least the problem's: a call may take fewer than its plan's most).
fn builder(pr: &Problem, s: &Setup, max_t: usize) -> PlanBuilder {
    let b = PlanBuilder::new().shape(max_t, pr.h, pr.f).norm(s.norm).bias(s.bias, s.bias).remat(s.remat).num_threads(1);
    if s.gated {
        b.gated(Activation::Silu, Activation::Linear)
    } else {
        b.activation(Activation::Gelu)
    }
}

/// One plan's forward and backward on the given (shard of the) problem.
#[allow(clippy::too_many_arguments)]
fn run_plan(
    b: PlanBuilder,
    s: &Setup,
    x: &[f32],
    dy: &[f32],
    pr: &Problem,
    w1: &[f32],
    b1: &[f32],
    w2: &[f32],
) -> (Vec<f32>, Gradients<f32>) {
    let mut plan = b.build().unwrap();
    let ln = s.norm == Norm::LayerNorm;
    let w = Weights {
        gamma: &pr.gamma,
        beta: ln.then_some(&pr.beta[..]),
        w1,
        b1: s.bias.then_some(b1),
        w2,
        b2: s.bias.then_some(&pr.b2[..]),
    };
    let mut y = vec![0f32; x.len()];
    let saved = plan.forward(x, &w, &mut y).unwrap();
    let g = plan.backward(dy, x, &w, &saved).unwrap();
    (y, g)
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// P ranks on P threads against the unsharded plan: y and every gradient assembled from the
/// shards within the f32 tolerance, and the replicated outputs bit-identical on every rank.
fn check_group(p: usize, sp: bool, s: Setup, seed: u64) {
    check_group_tokens(p, sp, s, seed, 0);
}

/// As check_group, with the ranks' plans made for `extra` more tokens per rank than their calls
/// take (the unsharded reference plan is made for exactly the call's).
fn check_group_tokens(p: usize, sp: bool, s: Setup, seed: u64, extra: usize) {
    let pr = problem(12, 40, 24, if s.gated { 2 } else { 1 }, seed);
    let (t, h, f, a) = (pr.t, pr.h, pr.f, pr.a);
    let (y1, g1) = run_plan(builder(&pr, &s, t), &s, &pr.x, &pr.dy, &pr, &pr.w1, &pr.b1, &pr.w2);

    let ranks = group(p);
    let shared = ranks[0].g.clone();
    let (fl, tl) = (f / p, if sp { t / p } else { t });
    let results: Vec<(Vec<f32>, Gradients<f32>)> = thread::scope(|sc| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|rk| {
                let (pr, s) = (&pr, &s);
                sc.spawn(move || {
                    let r = rk.rank;
                    let comm = Communicator::new(rk).unwrap();
                    assert_eq!((comm.size(), comm.rank()), (Some(p), Some(r)));
                    // W1 [H, A, F] -> [H, A, F/P]: this rank's columns of each of the A halves
                    // (one [H*A, F] matrix's columns); b1 likewise; W2 [F, H] -> its rows.
                    let w1 = cols(&pr.w1, f, r * fl, fl);
                    let b1 = cols(&pr.b1, f, r * fl, fl);
                    let w2 = pr.w2[r * fl * h..][..fl * h].to_vec();
                    let rows = |m: &[f32]| m[r * tl * h..][..tl * h].to_vec();
                    let (x, dy) = if sp { (rows(&pr.x), rows(&pr.dy)) } else { (pr.x.clone(), pr.dy.clone()) };
                    let b = builder(pr, s, t + extra * p).sharding(p, r, sp).communicator(&comm);
                    drop(comm); // the builder (and then the plan) keep it alive
                    run_plan(b, s, &x, &dy, pr, &w1, &b1, &w2)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(shared.calls.load(Ordering::Relaxed) > 0, "no collective ran");

    // Replicated outputs: identical bits on every rank.
    for (r, (y, g)) in results.iter().enumerate().skip(1) {
        let (y0, g0) = &results[0];
        if !sp {
            assert_eq!(y, y0, "y differs on rank {r}");
            assert_eq!(g.dx, g0.dx, "dx differs on rank {r}");
        }
        assert_eq!(g.dgamma, g0.dgamma, "dgamma differs on rank {r}");
        assert_eq!(g.dbeta, g0.dbeta, "dbeta differs on rank {r}");
        assert_eq!(g.db2, g0.db2, "db2 differs on rank {r}");
    }
    // Assemble the group's tensors.
    let (mut y, mut dx) = (vec![0f32; t * h], vec![0f32; t * h]);
    let (mut dw1, mut db1, mut dw2) = (vec![0f32; h * a * f], vec![0f32; a * f], vec![0f32; f * h]);
    for (r, (yr, g)) in results.iter().enumerate() {
        if sp {
            y[r * tl * h..][..tl * h].copy_from_slice(yr);
            dx[r * tl * h..][..tl * h].copy_from_slice(&g.dx);
        } else {
            y.copy_from_slice(yr);
            dx.copy_from_slice(&g.dx);
        }
        put_cols(&mut dw1, &g.dw1, f, r * fl, fl);
        if let Some(d) = &g.db1 {
            put_cols(&mut db1, d, f, r * fl, fl);
        }
        dw2[r * fl * h..][..fl * h].copy_from_slice(&g.dw2);
    }
    let g0 = &results[0].1;
    assert_close("y", &f64s(&y), &f64s(&y1), TOL_F32);
    assert_close("dx", &f64s(&dx), &f64s(&g1.dx), TOL_F32);
    assert_close("dgamma", &f64s(&g0.dgamma), &f64s(&g1.dgamma), TOL_F32);
    if let (Some(a), Some(b)) = (&g0.dbeta, &g1.dbeta) {
        assert_close("dbeta", &f64s(a), &f64s(b), TOL_F32);
    }
    assert_close("dw1", &f64s(&dw1), &f64s(&g1.dw1), TOL_F32);
    if let Some(b) = &g1.db1 {
        assert_close("db1", &f64s(&db1), &f64s(b), TOL_F32);
    }
    assert_close("dw2", &f64s(&dw2), &f64s(&g1.dw2), TOL_F32);
    if let (Some(a), Some(b)) = (&g0.db2, &g1.db2) {
        assert_close("db2", &f64s(a), &f64s(b), TOL_F32);
    }
}

#[test]
fn two_ranks_tensor_parallel_layernorm_gelu() {
    check_group(2, false, Setup { norm: Norm::LayerNorm, gated: false, bias: true, remat: Remat::SaveAll }, 1);
}

#[test]
fn two_ranks_sequence_parallel_layernorm_gelu() {
    check_group(2, true, Setup { norm: Norm::LayerNorm, gated: false, bias: true, remat: Remat::SaveAll }, 2);
}

#[test]
fn two_ranks_tensor_parallel_rmsnorm_swiglu_recompute() {
    check_group(2, false, Setup { norm: Norm::RmsNorm, gated: true, bias: false, remat: Remat::SaveStats }, 3);
}

#[test]
fn two_ranks_sequence_parallel_rmsnorm_swiglu_recompute() {
    check_group(2, true, Setup { norm: Norm::RmsNorm, gated: true, bias: true, remat: Remat::SaveFfn1 }, 4);
}

#[test]
fn two_ranks_fewer_tokens_than_the_plans_most() {
    for sp in [false, true] {
        let s = Setup { norm: Norm::LayerNorm, gated: true, bias: true, remat: Remat::SaveAll };
        check_group_tokens(2, sp, s, 6, 5);
    }
}

#[test]
fn three_ranks_sequence_parallel() {
    check_group(3, true, Setup { norm: Norm::LayerNorm, gated: true, bias: true, remat: Remat::SaveAll }, 5);
}

// ---- error paths ------------------------------------------------------------------------------------

/// Collectives that fail: by returning an error, or by panicking.
struct Failing {
    size: usize,
    rank: usize,
    panic: bool,
}

impl Failing {
    fn fail(&self, what: &str) -> CommResult {
        if self.panic {
            panic!("test panic in {what}");
        }
        Err(format!("test error in {what}").into())
    }
}

impl Collectives for Failing {
    fn size(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_gather(&self, _: &mut [u8], _: ElementType) -> CommResult {
        self.fail("all_gather")
    }
    fn reduce_scatter_sum(&self, _: &[f32], _: &mut [f32]) -> CommResult {
        self.fail("reduce_scatter")
    }
    fn all_reduce_sum(&self, _: &mut [f32]) -> CommResult {
        self.fail("all_reduce_sum")
    }
    fn all_reduce_max(&self, _: &mut [f32]) -> CommResult {
        self.fail("all_reduce_max")
    }
}

fn small_plan(comm: &Communicator, group_size: usize, rank: usize, sp: bool) -> lnmlp::Result<lnmlp::Plan> {
    PlanBuilder::new()
        .shape(4, 8, 16)
        .activation(Activation::Gelu)
        .num_threads(1)
        .sharding(group_size, rank, sp)
        .communicator(comm)
        .build()
}

/// Rank 0's forward on a group of two whose collectives fail (no other rank is needed: the first
/// collective fails at once).
fn forward_rank0(comm: &Communicator, sp: bool) -> lnmlp::Error {
    let mut plan = small_plan(comm, 2, 0, sp).unwrap();
    assert_eq!((plan.group_size(), plan.rank(), plan.local_ffn()), (2, 0, 8));
    assert_eq!(plan.local_tokens(), if sp { 2 } else { 4 });
    let x = vec![0.5f32; plan.x_len()];
    let (g, b) = (vec![1.0f32; 8], vec![0.0f32; 8]);
    let (w1, w2) = (vec![0.1f32; plan.w1_len()], vec![0.1f32; plan.w2_len()]);
    let w = Weights { gamma: &g, beta: Some(&b), w1: &w1, b1: None, w2: &w2, b2: None };
    let mut y = vec![0f32; plan.x_len()];
    plan.forward(&x, &w, &mut y).unwrap_err()
}

#[test]
fn a_collective_returning_an_error_fails_the_call_with_backend() {
    let comm = Communicator::new(Failing { size: 2, rank: 0, panic: false }).unwrap();
    let e = forward_rank0(&comm, false);
    assert_eq!(e.status(), Status::Backend, "{e}");
    assert!(e.message().contains("all_reduce_sum callback returned"), "{e}");
    assert!(e.message().contains("test error in all_reduce_sum"), "{e}");
    // The same communicator keeps working (failing) for the next call.
    let e = forward_rank0(&comm, true);
    assert_eq!(e.status(), Status::Backend, "{e}");
    assert!(e.message().contains("test error in all_gather"), "{e}");
}

#[test]
fn a_panicking_collective_returns_an_error_not_an_abort() {
    let comm = Communicator::new(Failing { size: 2, rank: 0, panic: true }).unwrap();
    for sp in [false, true] {
        let e = forward_rank0(&comm, sp);
        assert_eq!(e.status(), Status::Backend, "{e}");
        assert!(e.message().contains("panicked: test panic in"), "{e}");
    }
}

#[test]
fn mismatched_group_size_or_rank_is_refused_at_build() {
    let comm = Communicator::new(Failing { size: 2, rank: 1, panic: false }).unwrap();
    let e = small_plan(&comm, 3, 1, false).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("make them agree"), "{e}");
    let e = small_plan(&comm, 2, 0, false).unwrap_err(); // rank 0, communicator's is 1
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(small_plan(&comm, 2, 1, false).is_ok());
    // No communicator at all.
    let e = PlanBuilder::new().shape(4, 8, 16).sharding(2, 0, false).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("lnmlp_desc_set_communicator"), "{e}");
    // A group larger than the library allows.
    let e = PlanBuilder::new().shape(4, 8, 16).sharding(i32::MAX as usize + 1, 0, false).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // F not divisible by P.
    let e = PlanBuilder::new().shape(4, 8, 15).sharding(2, 1, false).communicator(&comm).build().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
}

#[test]
fn invalid_collectives_size_or_rank_is_refused() {
    // The C table's group_size is an int64_t, but at most INT32_MAX.
    for (size, rank) in [(0, 0), (2, 2), (i32::MAX as usize + 1, 0)] {
        let e = Communicator::new(Failing { size, rank, panic: false }).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "size {size} rank {rank}: {e}");
    }
}

#[test]
fn wrong_shard_lengths_are_caught_before_the_call() {
    let comm = Communicator::new(Failing { size: 2, rank: 0, panic: false }).unwrap();
    let mut plan = small_plan(&comm, 2, 0, true).unwrap();
    let x = vec![0.5f32; 4 * 8]; // the group's T rows, but the plan holds T/P
    let g = vec![1.0f32; 8];
    let (w1, w2) = (vec![0.1f32; 8 * 16], vec![0.1f32; 16 * 8]); // unsharded W1 and W2
    let w = Weights { gamma: &g, beta: Some(&g), w1: &w1, b1: None, w2: &w2, b2: None };
    let mut y = vec![0f32; 4 * 8];
    let e = plan.forward(&x, &w, &mut y).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("[T/P, H]"), "{e}");
    assert!(e.message().starts_with("x has 4 tokens"), "{e}");
    assert!(e.message().contains("at most 2 tokens per call"), "{e}");
}

#[test]
fn the_plan_keeps_its_communicator_alive() {
    // A one-rank group: the collectives are never called.
    let comm = Communicator::new(Failing { size: 1, rank: 0, panic: false }).unwrap();
    let mut plan = small_plan(&comm, 1, 0, false).unwrap();
    drop(comm);
    let x = vec![0.5f32; plan.x_len()];
    let (g, b) = (vec![1.0f32; 8], vec![0.0f32; 8]);
    let (w1, w2) = (vec![0.1f32; plan.w1_len()], vec![0.1f32; plan.w2_len()]);
    let w = Weights { gamma: &g, beta: Some(&b), w1: &w1, b1: None, w2: &w2, b2: None };
    let mut y = vec![0f32; plan.x_len()];
    plan.forward(&x, &w, &mut y).unwrap();
    assert!(plan.communicator().is_some());
}

#[test]
fn nccl_refuses_a_null_communicator() {
    // A pointer to a NULL ncclComm_t: a build without NCCL (or without a GPU) answers NOT_SUPPORTED
    // before reading it; a build with both reads it and refuses the NULL communicator.
    let null_comm: usize = 0;
    // SAFETY: the pointer is valid for reads of one pointer-sized value.
    let e = unsafe { Communicator::from_nccl_raw(&null_comm as *const usize as *const std::ffi::c_void) }.unwrap_err();
    assert!(matches!(e.status(), Status::NotSupported | Status::InvalidArgument), "{e}");
    // NULL is refused either way.
    // SAFETY: NULL is checked by the library.
    let e = unsafe { Communicator::from_nccl_raw(std::ptr::null()) }.unwrap_err();
    assert!(matches!(e.status(), Status::NullPointer | Status::NotSupported), "{e}");
}

#[test]
fn mpi_null_is_refused() {
    // SAFETY: NULL is checked by the library.
    let e = unsafe { Communicator::from_mpi_raw(std::ptr::null()) }.unwrap_err();
    assert!(matches!(e.status(), Status::NullPointer | Status::NotSupported), "{e}");
}

#[test]
fn communicator_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Communicator>();
}
