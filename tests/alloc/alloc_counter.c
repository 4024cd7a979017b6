/* A malloc interposer that counts heap allocations while armed, and can make the larger ones fail
 * (alloc_counter_fail_above) to model memory pressure, or the n-th one (alloc_counter_fail_nth) for
 * a fault-injection census. Linked into the test executable
 * (before libc), it sees every allocation of the process: the test's, lnmlp's and oneDNN's.
 * It forwards to glibc's __libc_* entry points, so it never recurses. Not for sanitizer builds,
 * which own malloc themselves. */
#include <stddef.h>
#include <stdint.h>
#include <errno.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

static volatile int armed_global = 0;
static volatile long count = 0;
static volatile long bytes = 0;
static volatile long largest = 0;
static volatile long fail_above = -1; /* while armed, allocations of more bytes fail; -1: none */
static volatile long failed = 0;
static volatile long fail_nth = 0; /* while armed, the fail_nth-th allocation fails (1-based); 0: none */
static volatile long seen = 0;     /* allocations since arming, the failed one included */

/* Records an allocation of n bytes; returns 0 when it must fail. */
static int note(size_t n) {
  if (!armed_global) return 1;
  if (fail_nth > 0 && __atomic_add_fetch(&seen, 1, __ATOMIC_RELAXED) == fail_nth) {
    __atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);
    return 0;
  }
  if (fail_above >= 0 && (long)n > fail_above) {
    __atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);
    return 0;
  }
  __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&bytes, (long)n, __ATOMIC_RELAXED);
  long cur = __atomic_load_n(&largest, __ATOMIC_RELAXED);
  while ((long)n > cur && !__atomic_compare_exchange_n(&largest, &cur, (long)n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return 1;
}

void* malloc(size_t n) { return note(n) ? __libc_malloc(n) : NULL; }
void* calloc(size_t m, size_t n) { return note(m * n) ? __libc_calloc(m, n) : NULL; }
void* realloc(void* p, size_t n) { return note(n) ? __libc_realloc(p, n) : NULL; }
void free(void* p) { __libc_free(p); }
void* memalign(size_t a, size_t n) { return note(n) ? __libc_memalign(a, n) : NULL; }
void* aligned_alloc(size_t a, size_t n) { return note(n) ? __libc_memalign(a, n) : NULL; }
int posix_memalign(void** out, size_t a, size_t n) {
  if (!note(n)) return ENOMEM;
  void* p = __libc_memalign(a, n);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

void alloc_counter_arm(void) {
  seen = 0;
  count = 0;
  bytes = 0;
  largest = 0;
  armed_global = 1;
}
void alloc_counter_disarm(long* out_count, long* out_bytes, long* out_largest) {
  armed_global = 0;
  *out_count = count;
  *out_bytes = bytes;
  *out_largest = largest;
}

/* While armed, allocations of more than n bytes fail (n < 0: none); returns how many failed since
 * the last call. */
long alloc_counter_fail_above(long n) {
  long was = __atomic_exchange_n(&failed, 0, __ATOMIC_RELAXED);
  fail_above = n;
  return was;
}

/* While armed, the n-th allocation after arming fails (n <= 0: none); returns how many failed since
 * the last call of this or alloc_counter_fail_above. */
long alloc_counter_fail_nth(long n) {
  long was = __atomic_exchange_n(&failed, 0, __ATOMIC_RELAXED);
  fail_nth = n;
  return was;
}
