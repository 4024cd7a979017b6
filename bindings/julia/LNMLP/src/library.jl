# Finding liblnmlp and checking its ABI version, lazily (a missing library must not make
# `using LNMLP` fail; the first call that needs it explains what to do).

# The library every ccall in capi.jl names. A global assigned in __init__ (not a const): the path
# is decided when the package is loaded, not when it was precompiled. ccall reads a global library
# name at run time (Julia >= 1.6).
liblnmlp = "liblnmlp.so.2"

const _loaded = Ref(false)           # set once the ABI check passed
const _load_lock = ReentrantLock()

"""
    find_liblnmlp() -> String

`ENV["LNMLP_LIBRARY"]` when set (an explicit choice is never replaced by another library), else
the first of `liblnmlp.so.2`, `liblnmlp` that `Libdl.find_library` finds, else `"liblnmlp.so.2"`
(left to the system loader, which then reports what it could not find).
"""
function find_liblnmlp()
    p = get(ENV, "LNMLP_LIBRARY", "")
    isempty(p) || return p
    found = Libdl.find_library(["liblnmlp.so.2", "liblnmlp"])
    return isempty(found) ? "liblnmlp.so.2" : found
end

"""
    ensure_loaded()

Opens the library once and refuses it unless its ABI version equals `LNMLP_ABI_VERSION`
(a library of another ABI would be called with the wrong signatures). Every high-level entry
point calls this first; the raw `lnmlp_*` wrappers in capi.jl do not.
"""
function ensure_loaded()
    _loaded[] && return nothing
    lock(_load_lock) do
        _loaded[] && return nothing
        if Libdl.dlopen(liblnmlp; throw_error=false) === nothing
            throw(LNMLPError(Int32(-1), "could not load liblnmlp from \"$liblnmlp\"; build it " *
                "(cmake --build <build dir> --target lnmlp) and set ENV[\"LNMLP_LIBRARY\"] to its path"))
        end
        v = Ref{Int32}.(zeros(Int32, 4))
        st = lnmlp_get_version(v[1], v[2], v[3], v[4])
        if st != LNMLP_SUCCESS || v[4][] != LNMLP_ABI_VERSION
            throw(LNMLPError(Int32(-1), "$liblnmlp has ABI version $(v[4][]) (library " *
                "$(v[1][]).$(v[2][]).$(v[3][])), but LNMLP.jl needs ABI version $LNMLP_ABI_VERSION; " *
                "point ENV[\"LNMLP_LIBRARY\"] at a matching library"))
        end
        _loaded[] = true
    end
    return nothing
end

"""`(major, minor, patch, abi)` of the loaded library."""
function library_version()
    ensure_loaded()
    v = Ref{Int32}.(zeros(Int32, 4))
    check(lnmlp_get_version(v[1], v[2], v[3], v[4]))
    return (Int(v[1][]), Int(v[2][]), Int(v[3][]), Int(v[4][]))
end
