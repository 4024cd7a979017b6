#!/usr/bin/env bash
# The style of a change (CONTRIBUTING.md): clang-format (.clang-format) on the lines it touches, and
# clang-tidy (.clang-tidy) on the C++ files it touches, headers included, through the release
# build's compile_commands.json.
#
#   bash scripts/check-style.sh [BASE]     BASE: what the change is against (default HEAD~1, on main
#                                          the previous landing); LNMLP_STYLE_BUILD: the build tree
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
build=${LNMLP_STYLE_BUILD:-build/release}
if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
  echo "check-style: $base is not a commit here (a shallow clone?); nothing to compare with, skipped"
  exit 0
fi
mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$base" -- \
  'src/*.h' 'src/*.cpp' 'src/*.cu' 'src/*.cuh' 'tests/*.h' 'tests/*.cpp' 'bench/*.h' 'bench/*.cpp' 'examples/*.c' \
  'bindings/python/xla_ffi/*.h' 'bindings/python/xla_ffi/*.cpp')
if ((${#files[@]} == 0)); then
  echo "check-style: no C/C++ file changed since $base"
  exit 0
fi
status=0

# 1. clang-format on the changed lines (rename-aware: a moved file is checked on its edits only).
if ! python3 tools/check_format_changed.py "$base" "${files[@]}"; then
  echo "check-style: the changes above are not formatted as .clang-format says; run clang-format on those lines"
  echo "             (clang-format -i --lines=A:B FILE, or git clang-format $base for files that were not moved)"
  status=1
else
  echo "check-style: clang-format clean on the lines changed since $base (${#files[@]} files)"
fi

# 2. clang-tidy on the changed C++ files of the library (what the build compiles), and on the
#    changed headers through them.
if [ ! -f "$build/compile_commands.json" ]; then
  echo "check-style: no $build/compile_commands.json (configure the release preset first)" >&2
  exit 1
fi
headers=()
sources=()
for f in "${files[@]}"; do
  case "$f" in
    src/*.h) headers+=("$f") ;;
    src/*.cpp) sources+=("$f") ;;
    bindings/python/xla_ffi/*.h) headers+=("$f") ;;
    bindings/python/xla_ffi/*.cpp) sources+=("$f") ;;  # where the build made liblnmlp_xla
  esac
done
# A changed header is checked in the translation units that include it: add one of them.
for h in "${headers[@]}"; do
  [[ $h == src/* ]] || continue
  inc=${h#src/}
  user=$(grep -rl --include='*.cpp' -e "\"$inc\"" -e "\"$(basename "$inc")\"" src | head -n1 || true)
  [ -n "$user" ] && sources+=("$user")
done
mapfile -t sources < <(printf '%s\n' "${sources[@]}" | sort -u)
filter='^$'
if ((${#headers[@]})); then
  filter=$(printf '%s\n' "${headers[@]}" | sed 's/[.]/[.]/g' | paste -sd'|')
  filter="($filter)$"
fi
tidied=0
for f in "${sources[@]}"; do
  [ -n "$f" ] || continue
  grep -q "\"file\": \"$PWD/$f\"" "$build/compile_commands.json" || continue  # not built in this tree
  if ! clang-tidy --quiet -p "$build" --header-filter="$filter" --extra-arg=-Wno-unknown-warning-option "$f" 2>/dev/null; then
    echo "check-style: clang-tidy found the problems above in $f"
    status=1
  fi
  tidied=$((tidied + 1))
done
echo "check-style: clang-tidy run on $tidied changed translation unit(s) since $base"
exit $status
