"""
    LNMLP

Julia binding of lnmlp (`include/lnmlp.h`): a transformer feed-forward sublayer
`y = act(norm(x) * W1 + b1) * W2 + b2`, fused, forward and backward, through `ccall`.

Arrays are Julia (column-major) arrays whose dimensions are the C shapes reversed, so that the
memory is exactly the row-major tensor the C API expects: `x` is `(hidden, tokens)`, `w1` is
`(ffn, A, hidden)` (or `(ffn, hidden)` when A = 1), `w2` is `(hidden, ffn)`, `b1` is `(ffn, A)`.
`tokens` is each call's own (x's trailing dims, from 0 to the plan's most); `tensor_shape(plan, t)`
gives every size.

The library is `ENV["LNMLP_LIBRARY"]` when set, else what `Libdl.find_library` finds
(`liblnmlp.so.2`, `liblnmlp`); its ABI version must equal [`LNMLP_ABI_VERSION`](@ref).
"""
module LNMLP

using Libdl

# constants.jl and capi.jl are generated from include/lnmlp.h by tools/gen_bindings.py (its CTest
# fails when they differ from the header): never edit them by hand, rerun the generator.
include("constants.jl")   # generated: the header's enum constants (Int32) and integer #defines (Int)
include("library.jl")     # finding the library, the ABI check, LNMLP_ABI_VERSION's docstring
include("capi.jl")        # generated: one raw ccall wrapper per C function (the only file with
                          # ccall), the lnmlp_comm_callbacks struct
include("errors.jl")      # LNMLPError, check, _int_in (integer arguments range-checked before ccall)
include("bfloat16.jl")    # BFloat16, a 16-bit storage type for LNMLP_DTYPE_BF16
include("plan.jl")        # Plan, forward, backward, backward!, close
include("fp8.jl")         # FP8 conversions and delayed-scaling state

export Plan, LNMLPError, BFloat16, forward, backward, forward!, backward!, new_grads, attach_workspace!,
       quantizer_state, set_quantizer_state!, export_state, import_state!, fp8_encode, fp8_decode,
       library_version, build_info, query_support, tensor_shape, new_fp8_state, attach_fp8_state!,
       rng_state, set_rng_state!, set_rng_place!

function __init__()
    # At load time, not at precompile time: the path may differ between the two.
    global liblnmlp = find_liblnmlp()
    _loaded[] = false
end

end # module
