# BFloat16: the storage type of LNMLP_DTYPE_BF16 tensors (the upper 16 bits of a Float32).
# Julia has no bfloat16 in Base; this primitive type gives Array{BFloat16} the exact memory layout
# the library reads, without depending on another package. Arithmetic goes through Float32.

"""
    BFloat16(x)

A bfloat16 number (1 sign, 8 exponent, 7 mantissa bits). `BFloat16(x)` rounds to nearest, ties to
even; `Float32(b)` is exact. Use it as the element type of arrays for a `dtype=BFloat16` plan.
"""
primitive type BFloat16 <: AbstractFloat 16 end

function BFloat16(x::Float32)
    u = reinterpret(UInt32, x)
    if isnan(x)  # keep the sign, force a quiet NaN (truncation could turn a NaN into infinity)
        return reinterpret(BFloat16, UInt16(u >> 16) | 0x0040)
    end
    u += 0x00007fff + ((u >> 16) & 0x00000001)  # round to nearest, ties to even
    return reinterpret(BFloat16, UInt16(u >> 16))
end
BFloat16(x::Real) = BFloat16(Float32(x))
BFloat16(x::BFloat16) = x

Base.Float32(x::BFloat16) = reinterpret(Float32, UInt32(reinterpret(UInt16, x)) << 16)
Base.Float64(x::BFloat16) = Float64(Float32(x))
Base.convert(::Type{BFloat16}, x::Real) = BFloat16(x)
Base.promote_rule(::Type{BFloat16}, ::Type{T}) where {T<:AbstractFloat} = promote_type(Float32, T)
Base.promote_rule(::Type{BFloat16}, ::Type{<:Integer}) = Float32
Base.zero(::Type{BFloat16}) = reinterpret(BFloat16, 0x0000)
Base.one(::Type{BFloat16}) = reinterpret(BFloat16, 0x3f80)
Base.isnan(x::BFloat16) = isnan(Float32(x))
Base.isfinite(x::BFloat16) = isfinite(Float32(x))
Base.show(io::IO, x::BFloat16) = print(io, "BFloat16(", Float32(x), ")")
