# FP8: element conversions (lnmlp_fp8_encode / _decode) and the delayed-scaling quantizer state a
# plan owns or a caller attaches (scale + amax history per quantizer; export/import as a checkpoint
# blob, which is in lnmlp.h's experimental tier).

const QUANTIZERS = (:ln_out, :w1, :act_out, :w2, :dy, :dh)  # LNMLP_QUANTIZER_* order
# The FP8 element types of lnmlp_fp8_encode / _decode (LNMLP_DTYPE_FP8_*; not the recipe's
# LNMLP_FP8_FORMAT_* choice, whose numbers the library refuses here).
const _FP8 = Dict(:e4m3 => LNMLP_DTYPE_FP8_E4M3, :e5m2 => LNMLP_DTYPE_FP8_E5M2)

function _quantizer(q)
    q isa Integer && 0 <= q < LNMLP_QUANTIZER_COUNT && return Int32(q)
    i = findfirst(==(Symbol(q)), QUANTIZERS)
    i === nothing && argerror("quantizer must be one of $(QUANTIZERS) or 0..5, got $(repr(q))")
    return Int32(i - 1)
end

"""`fp8_encode(format, x::Vector{Float32}, scale) -> Vector{UInt8}`: `fp8(x * scale)`, format `:e4m3`/`:e5m2` (`LNMLP_DTYPE_FP8_E4M3`/`_E5M2`)."""
function fp8_encode(format, x::Vector{Float32}, scale::Real)
    ensure_loaded()
    out = Vector{UInt8}(undef, length(x))
    GC.@preserve x out check(lnmlp_fp8_encode(_choice("format", format, _FP8), pointer(x), Int64(length(x)),
                                              Float32(scale), pointer(out)))
    return out
end

"""`fp8_decode(format, codes::Vector{UInt8}, scale_inv) -> Vector{Float32}`: `float(code) * scale_inv`."""
function fp8_decode(format, codes::Vector{UInt8}, scale_inv::Real)
    ensure_loaded()
    out = Vector{Float32}(undef, length(codes))
    GC.@preserve codes out check(lnmlp_fp8_decode(_choice("format", format, _FP8), pointer(codes),
                                                  Int64(length(codes)), Float32(scale_inv), pointer(out)))
    return out
end

"""`rng_state(plan) -> (seed::UInt64, offset::UInt64)`: the stream the next backward that rounds
stochastically (recipe `:nvfp4`'s dy and dh) draws from; each such backward moves `offset` on by one."""
function rng_state(p::Plan)
    lock(p.lock) do
        seed, offset = Ref{UInt64}(0), Ref{UInt64}(0)
        check(lnmlp_plan_get_rng_state(_live(p), seed, offset))
        return (seed[], offset[])
    end
end

"""`set_rng_state!(plan, seed, offset=0)`: a backward's draws follow from `(seed, offset)` alone."""
function set_rng_state!(p::Plan, seed::Integer, offset::Integer=0)
    s, o = UInt64(seed), UInt64(offset)  # InexactError outside [0, 2^64)
    lock(p.lock) do
        check(lnmlp_plan_set_rng_state(_live(p), s, o))
    end
    return nothing
end

"""`set_rng_place!(plan, first_token, whole_tokens, ffn_part=0, ffn_parts=1)`: where the plan's calls
lie in the whole tensors the random stream is drawn over (a split done by the caller): tokens from
`first_token` of `whole_tokens` (0: the call's count), F part `ffn_part` of `ffn_parts`."""
function set_rng_place!(p::Plan, first_token::Integer, whole_tokens::Integer, ffn_part::Integer=0,
                        ffn_parts::Integer=1)
    lock(p.lock) do
        check(lnmlp_plan_set_rng_place(_live(p), Int64(first_token), Int64(whole_tokens), Int32(ffn_part),
                                       Int32(ffn_parts)))
    end
    return nothing
end

function _require_state(p::Plan)
    p.amax_history_length == 0 && throw(LNMLPError(LNMLP_ERROR_INVALID_ARGUMENT,
        "this plan's recipe (:$(p.recipe)) keeps no quantizer state; only recipe=:delayed does"))
end

"""`quantizer_state(plan, q) -> (scale::Float32, amax_history::Vector{Float32})`, newest entry first."""
function quantizer_state(p::Plan, q)
    lock(p.lock) do
        h = _live(p)
        _require_state(p)
        scale = Ref{Float32}(0)
        hist = Vector{Float32}(undef, p.amax_history_length)
        GC.@preserve hist check(lnmlp_plan_get_quantizer_state(h, _quantizer(q), scale, pointer(hist),
                                                               Int64(length(hist))))
        return (scale[], hist)
    end
end

"""`set_quantizer_state!(plan, q, scale, amax_history)`: replaces one quantizer's state."""
function set_quantizer_state!(p::Plan, q, scale::Real, amax_history::AbstractVector)
    hist = Vector{Float32}(amax_history)
    lock(p.lock) do
        h = _live(p)
        _require_state(p)
        GC.@preserve hist check(lnmlp_plan_set_quantizer_state(h, _quantizer(q), Float32(scale), pointer(hist),
                                                               Int64(length(hist))))
    end
    return p
end

"""
    export_state(plan) -> Vector{UInt8}

The whole quantizer state as a versioned blob (empty if stateless).

Experimental (`lnmlp_plan_export_state`, in lnmlp.h's experimental tier): the blob's format may
change in any release. [`quantizer_state`](@ref) / [`set_quantizer_state!`](@ref) are the stable
way to save and restore the state.
"""
function export_state(p::Plan)
    lock(p.lock) do
        h = _live(p)
        blob = Vector{UInt8}(undef, p.state_bytes)
        p.state_bytes == 0 && return blob
        GC.@preserve blob check(lnmlp_plan_export_state(h, pointer(blob), Int64(length(blob))))
        return blob
    end
end

"""
    import_state!(plan, blob)

Restores an [`export_state`](@ref) blob bit for bit (or throws, changing nothing).
Experimental (`lnmlp_plan_import_state`), as [`export_state`](@ref).
"""
function import_state!(p::Plan, blob::Vector{UInt8})
    lock(p.lock) do
        h = _live(p)
        GC.@preserve blob check(lnmlp_plan_import_state(h, isempty(blob) ? C_NULL : pointer(blob),
                                                        Int64(length(blob))))
    end
    return p
end

"""
    new_fp8_state(plan) -> Matrix{Float32}

A fresh delayed-scaling state for `plan` (every scale 1, every history entry 0), of
`tensor_shape(plan, :fp8_state)` = `(1 + amax_history_len, 6)`: column `q + 1` is quantizer q
(`LNMLP_QUANTIZER_*` order), its scale in row 1 and its amax history, newest first, below. Pass it
as `fp8_state=` to `forward`/`backward`, or attach it with [`attach_fp8_state!`](@ref).
"""
function new_fp8_state(p::Plan)
    lock(p.lock) do
        h = _live(p)
        _require_state(p)
        state = zeros(Float32, _shape(h, LNMLP_TENSOR_FP8_STATE))
        state[1, :] .= 1
        return state
    end
end

"""
    attach_fp8_state!(plan, state::Matrix{Float32})
    attach_fp8_state!(plan, nothing)

Makes the caller's `state` (see [`new_fp8_state`](@ref)) the plan's delayed-scaling state from now
on: forward / backward without `fp8_state=`, `quantizer_state`, `set_quantizer_state!`,
`export_state` and `import_state!` read and update it in place. `nothing` goes back to the plan's
own state, which kept its values. The plan keeps `state` alive while it is attached.
"""
function attach_fp8_state!(p::Plan, state)
    lock(p.lock) do
        h = _live(p)
        _require_state(p)
        sp = _fp8_ptr(p, h, state)
        GC.@preserve state check(lnmlp_plan_attach_fp8_state(h, sp))
        p.fp8_state = state
    end
    return p
end
