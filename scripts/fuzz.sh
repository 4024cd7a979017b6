#!/usr/bin/env bash
# The libFuzzer harnesses of tests/fuzz (tests/fuzz/README.md): configures and builds the fuzz
# preset (clang; the library built with AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's
# coverage), then runs each harness for N seconds over a copy of its seed corpus, prints its
# executions and final coverage, and exits non-zero when any harness found a crash.
#
#   bash scripts/fuzz.sh [SECONDS_PER_HARNESS]          default 60
#
#   LNMLP_FUZZ_HARNESSES="fuzz_plan fuzz_state"          run some harnesses only
#   LNMLP_FUZZ_BUILD_JOBS=1                              build jobs (default: nproc)
#
# Each harness runs in build/fuzz/corpus-run/<harness> (the repository's corpus is only read; what a
# run finds stays there for the next run: delete the folder to start from the seeds again); a crash
# leaves its input in build/fuzz/corpus-run/artifacts/<harness>/ and the report in <harness>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
harnesses=${LNMLP_FUZZ_HARNESSES:-fuzz_plan fuzz_state fuzz_fp8}

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"${LNMLP_FUZZ_BUILD_JOBS:-$(nproc)}"

# Stop at the first report; OpenMP teams of at most 2 threads (the harnesses' plans ask for 0 .. 2).
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

run=build/fuzz/corpus-run
status=0
summary=()
for h in $harnesses; do
  corpus=$run/$h
  artifacts=$run/artifacts/$h
  log=$run/$h.log
  mkdir -p "$corpus" "$artifacts"
  cp -n tests/fuzz/corpus/"$h"/* "$corpus"/
  # The corpus of the harness's long run, minimised (tests/fuzz/README.md, "Long runs"): every
  # input once, before fuzzing (a 60 s run may stop while its corpus is still loading).
  archive=tests/fuzz/corpus/$h.tar.xz
  if [[ -f $archive ]]; then
    tar -C "$corpus" --skip-old-files -xJf "$archive"
    replay=$run/$h.replay
    rm -rf "$replay" && mkdir -p "$replay"
    tar -C "$replay" -xJf "$archive"
    echo "=== $h: the $(ls "$replay" | wc -l) inputs of $archive, once each"
    if ! build/fuzz/tests/fuzz/"$h" "$replay" -runs=0 -timeout=10 -rss_limit_mb=4096 >"$run/$h.replay.log" 2>&1; then
      status=1
      tail -n 60 "$run/$h.replay.log"
      summary+=("$h: an input of $archive fails")
    else
      summary+=("$h: $archive replayed, $(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$run/$h.replay.log" | tail -n1)")
    fi
  fi
  # The inputs that once broke a promise (tests/fuzz/crashes/README.md) must pass: regressions.
  if compgen -G "tests/fuzz/crashes/$h/*" >/dev/null; then
    echo "=== $h: the inputs of tests/fuzz/crashes/$h, once each"
    if ! build/fuzz/tests/fuzz/"$h" tests/fuzz/crashes/"$h"/* >"$run/$h.regressions.log" 2>&1; then
      status=1
      tail -n 60 "$run/$h.regressions.log"
      summary+=("$h: a regression input of tests/fuzz/crashes/$h fails again")
    fi
  fi
  echo "=== $h: ${seconds}s over $corpus ($(ls "$corpus" | wc -l) inputs)"
  rc=0
  build/fuzz/tests/fuzz/"$h" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 -print_funcs=0 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
  # No such line when the time ran out while the corpus was still loading: say so, do not stop.
  cov=$(grep -E '^#[0-9]+' "$log" | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' | tail -n1 || true)
  line="$h: ${execs:-?} executions (${speed:-?}/s), ${cov:-no coverage line}"
  if ((rc != 0)); then
    status=1
    line="$line: CRASH (exit $rc; input in $artifacts/, report in $log)"
    echo "--- $h failed; the end of $log:"
    tail -n 60 "$log"
  fi
  echo "$line"
  summary+=("$line")
done

echo "=== fuzz summary (${seconds}s per harness)"
printf '  %s\n' "${summary[@]}"
exit $status
