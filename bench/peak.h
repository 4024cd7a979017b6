// This machine's measured arithmetic peak, the denominator of "fraction of peak".
#pragma once

struct Peak {
  double gflops;       // GFLOP/s on all threads
  const char* what;    // the instruction measured
};

// fp32 FMA peak (AVX-512 or AVX2 FMA), on `threads` threads.
Peak measure_fp32_peak(int threads);
// bf16 tile peak (AMX-BF16 tdpbf16ps, what oneDNN uses for bf16 GEMMs on this machine);
// gflops = 0 if unsupported.
Peak measure_amx_bf16_peak(int threads);
// bf16 dot-product peak (AVX512_BF16 vdpbf16ps) on `threads` threads; gflops = 0 if unsupported.
Peak measure_bf16_peak(int threads);
