# shellcheck shell=bash
# Sourced (not run) by the checks of what a package ships -- the wheel's (bindings/python/
# check_install.sh) and the jar's (bindings/swig/build_jar.sh, run_tests.sh) -- so that they agree
# on what a shipped library may take from the machine, and hide the machine's oneDNN alike.

# What every manylinux system provides (glibc's libraries, libstdc++, libgcc_s): everything else a
# shipped library needs must be shipped with it, or be loaded at run time only when asked for.
SYSTEM_LIBRARY_RE='^(linux-vdso|ld-linux|libc|libm|libmvec|libdl|librt|libpthread|libstdc\+\+|libgcc_s)\.'

# Left to the machine on purpose, loaded at run time only when a program asks for them: the MPI
# module's MPI (liblnmlp_mpi.so.1, lnmlp_comm_create_mpi), and the CUDA module's cuBLASLt and NCCL
# (from NVIDIA's pip wheels or a CUDA install).
# shellcheck disable=SC2034  # used by the scripts that source this file
RUN_TIME_LIBRARIES=(libmpi.so.40 libcublasLt.so.13 libnccl.so.2)

# needed_from_machine LIB: "name path" for each library ldd resolves for LIB (its whole closure)
# that is not one of SYSTEM_LIBRARY_RE's.
needed_from_machine() {
  local name path
  while read -r name _ path _; do
    [[ "$name" =~ $SYSTEM_LIBRARY_RE ]] || echo "$name $path"
  done < <(ldd "$1" | grep '=>')
}

# hide_system_onednn [PREFIX]: sets HIDE_ONEDNN to a command prefix that runs a command with the
# machine's oneDNN hidden from the loader (a private mount namespace with /dev/null over it), or to
# nothing where this process may not make one; says which on stdout, after PREFIX. (Call it
# directly, not in $(...): a subshell's HIDE_ONEDNN is lost.)
# shellcheck disable=SC2034  # HIDE_ONEDNN is the caller's
hide_system_onednn() {
  local dnnl
  HIDE_ONEDNN=()
  dnnl="$(readlink -f "$(ldconfig -p | awk '/libdnnl\.so\.[0-9]+ /{print $NF; exit}')" 2>/dev/null || true)"
  if [ -n "$dnnl" ] && unshare -m true 2>/dev/null; then
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
    HIDE_ONEDNN=(unshare -m sh -c "mount --bind /dev/null '$dnnl' && exec \"\$0\" \"\$@\"")
    echo "${1:-}the system's oneDNN ($dnnl) is hidden from the loader"
  else
    echo "${1:-}the system's oneDNN is not hidden (no private mount namespace here)"
  fi
}
