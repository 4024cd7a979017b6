# Errors: every failing status becomes an LNMLPError carrying the library's own message
# (lnmlp_last_error, thread-local in C, so it is read right after the failing call on the
# same thread). Checks the binding makes before calling C use the same type and status codes.

"""
    LNMLPError(status, message)

A failed lnmlp call. `status` is the `LNMLP_ERROR_*` code (or -1 when the library itself could not
be loaded or has another ABI); `message` is the library's explanation (`lnmlp_last_error`).
"""
struct LNMLPError <: Exception
    status::Int32
    message::String
end

"""The name of a status code ("LNMLP_ERROR_NULL_POINTER"), from the library when it is loaded."""
function status_name(status::Integer)
    status == -1 && return "LNMLP_LIBRARY_UNAVAILABLE"
    _loaded[] || return "status $status"
    return unsafe_string(lnmlp_status_string(Int32(status)))
end

Base.showerror(io::IO, e::LNMLPError) =
    print(io, "LNMLPError: ", e.message, " [", status_name(e.status), "]")

"""Throws `LNMLPError(status, lnmlp_last_error())` unless `status` is `LNMLP_SUCCESS`."""
@inline function check(status::Integer)
    status == LNMLP_SUCCESS && return nothing
    msg = unsafe_string(lnmlp_last_error())
    throw(LNMLPError(Int32(status), isempty(msg) ? "(no message)" : msg))
end

# A binding-side argument check, reported like the library reports its own.
argerror(msg::AbstractString) = throw(LNMLPError(LNMLP_ERROR_INVALID_ARGUMENT, msg))

# An integer argument as its C parameter's type T, checked to lie in [lo, hi] (T's range, or the
# tighter one the binding documents) before ccall converts it: ccall's own conversion throws an
# InexactError instead of this error, and a Bool would pass as 0 or 1.
function _int_in(name, v, lo::T, hi::T) where {T<:Integer}
    v isa Integer && !(v isa Bool) || argerror("$name must be an integer, got $(repr(v))")
    lo <= v <= hi || argerror("$name must be in [$lo, $hi], got $v")
    return T(v)
end
const _INT64 = (typemin(Int64), typemax(Int64))
const _INT32 = (typemin(Int32), typemax(Int32))
