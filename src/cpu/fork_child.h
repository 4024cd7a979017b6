// Whether this process is a fork() child of the process that loaded lnmlp.
//
// After fork() the child has only the thread that forked, but the OpenMP runtime (libgomp, which
// oneDNN shares) still believes its pool threads exist: the child's first parallel region of
// more than one thread waits for them forever. libgomp cannot be reset, so in a forked child every
// CPU call runs on its calling thread alone (as PyTorch does), and a plan made before the fork
// remakes its GEMMs for one thread (oneDNN fixes a GEMM's thread count when it makes it). The
// results are right; bit for bit the parent's except where oneDNN splits a GEMM's sums by thread
// count (its sgemm driver, below AVX-512).
#pragma once

namespace lnmlp::cpu {

bool in_forked_child() noexcept;

}  // namespace lnmlp::cpu
