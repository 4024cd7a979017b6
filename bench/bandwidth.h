// This machine's measured memory bandwidth, the denominator of "% of bandwidth" where the block is
// memory-bound (a forward at a few tokens reads its weights once).
#pragma once

struct Bandwidth {
  double gbs;        // GB/s (1e9 bytes) on all threads
  double array_mib;  // each of the three arrays, MiB
};

// The STREAM triad, a[i] = b[i] + s * c[i] over three float arrays far larger than any cache, on
// `threads` threads (each touching first the part it runs over), counted as STREAM counts it:
// 12 bytes an element (two reads, one write). Best of ten passes, as STREAM reports.
Bandwidth measure_triad_bandwidth(int threads);
