# Plan: a validated, allocated fused LayerNorm-MLP, run forward and backward many times.
# Mirrors the Python binding's lnmlp.Plan (keyword names follow this binding's brief: `norm`,
# `activations`), on Julia arrays whose dimensions are the C shapes reversed (see LNMLP.jl).

const _DTYPES = Dict{DataType,Int32}(Float32 => LNMLP_DTYPE_F32, BFloat16 => LNMLP_DTYPE_BF16,
                                     Float16 => LNMLP_DTYPE_F16)
const _NORMS = Dict(:layernorm => LNMLP_NORM_LAYERNORM, :rmsnorm => LNMLP_NORM_RMSNORM)
const ACTIVATIONS = Dict(:linear => LNMLP_ACT_LINEAR, :relu => LNMLP_ACT_RELU, :gelu => LNMLP_ACT_GELU,
                         :silu => LNMLP_ACT_SILU, :quick_gelu => LNMLP_ACT_QUICK_GELU,
                         :squared_relu => LNMLP_ACT_SQUARED_RELU, :sigmoid => LNMLP_ACT_SIGMOID,
                         :clamped_silu => LNMLP_ACT_CLAMPED_SILU, :clamped_linear => LNMLP_ACT_CLAMPED_LINEAR)
"""The gated pairs users ask for by name (as in the Python binding)."""
const GATED_PAIRS = Dict(:geglu => (:gelu, :linear), :swiglu => (:silu, :linear), :reglu => (:relu, :linear),
                         :qgeglu => (:quick_gelu, :linear), :sreglu => (:squared_relu, :linear),
                         :glu => (:sigmoid, :linear), :clamped_swiglu => (:clamped_silu, :clamped_linear))
const _REMATS = Dict(:save_all => LNMLP_REMAT_SAVE_ALL, :save_ffn1 => LNMLP_REMAT_SAVE_FFN1,
                     :save_stats => LNMLP_REMAT_SAVE_STATS, :forward_only => LNMLP_REMAT_FORWARD_ONLY)
const _RECIPES = Dict(:none => LNMLP_RECIPE_NONE, :delayed => LNMLP_RECIPE_DELAYED,
                      :current => LNMLP_RECIPE_CURRENT, :block => LNMLP_RECIPE_BLOCK, :mxfp8 => LNMLP_RECIPE_MXFP8)
const _FORMATS = Dict(:default => LNMLP_FP8_FORMAT_DEFAULT, :hybrid => LNMLP_FP8_FORMAT_HYBRID,
                      :e4m3 => LNMLP_FP8_FORMAT_E4M3)
const _ALGOS = Dict(:max => LNMLP_AMAX_ALGO_MAX, :most_recent => LNMLP_AMAX_ALGO_MOST_RECENT)

_choice(what, v, table) = haskey(table, Symbol(v)) ? table[Symbol(v)] :
    argerror("$what must be one of $(join(sort!(collect(keys(table))), ", ")), got $(repr(v))")

function _activations(a)
    acts = a isa Union{Symbol,AbstractString} ? (Symbol(a),) : Tuple(Symbol.(a))
    length(acts) == 1 && haskey(GATED_PAIRS, acts[1]) && (acts = GATED_PAIRS[acts[1]])
    1 <= length(acts) <= 2 || argerror("activations must have 1 or 2 entries, got $(repr(a))")
    foreach(x -> _choice("activation", x, ACTIVATIONS), acts)
    return acts
end

"""
    Plan(tokens, hidden, ffn; norm=:layernorm, zero_centered_gamma=false, epsilon=1e-6,
         activations=(:relu,), act_params=nothing, use_bias1=false, use_bias2=false,
         dtype=Float32, remat=:save_all, num_threads=0, backend=:cpu, external_workspace=false,
         recipe=:none, fp8_format=:default, margin=0, amax_history_len=1024, amax_compute_algo=:max,
         power_2_scale=-1, amax_epsilon=0.0)

Validates and allocates a fused block (`lnmlp_plan_create`). `activations` is a name (`:gelu`, or a
pair name such as `:swiglu`) or a tuple of 1 or 2 names; `act_params` is `(limit=, alpha=, offset=)`
for `:clamped_swiglu`; `dtype` is `Float32`, `Float16` or [`BFloat16`](@ref); `recipe` is one of
`:none, :delayed, :current, :block, :mxfp8` with the options of `lnmlp_desc_set_*`.
Only the CPU backend (host arrays) is supported by this binding.

Free it with `close(plan)` (idempotent), or let the garbage collector's finalizer do it.
One plan must be used by one task at a time; calls on one Plan are serialized by a lock.
"""
mutable struct Plan
    handle::Ptr{Cvoid}
    tokens::Int
    hidden::Int
    ffn::Int
    norm::Symbol
    activations::Tuple{Vararg{Symbol}}
    dtype::DataType
    use_bias1::Bool
    use_bias2::Bool
    remat::Symbol
    recipe::Symbol
    external_workspace::Bool
    workspace_bytes::Int
    saved_bytes::Int
    saved_bytes_per_token::Int
    alignment::Int
    amax_history_length::Int
    state_bytes::Int
    workspace::Union{Nothing,Vector{UInt8}}  # attached caller workspace, kept alive by the plan
    lock::ReentrantLock
end

function Plan(tokens::Integer, hidden::Integer, ffn::Integer; norm=:layernorm, zero_centered_gamma::Bool=false,
              epsilon::Real=1e-6, activations=(:relu,), act_params=nothing, use_bias1::Bool=false,
              use_bias2::Bool=false, dtype::Type=Float32, remat=:save_all, num_threads::Integer=0,
              backend=:cpu, external_workspace::Bool=false, recipe=:none, fp8_format=:default,
              margin::Integer=0, amax_history_len::Integer=1024, amax_compute_algo=:max,
              power_2_scale::Integer=-1, amax_epsilon::Real=0.0, sharding=nothing)
    ensure_loaded()
    acts = _activations(activations)
    haskey(_DTYPES, dtype) || argerror("dtype must be Float32, Float16 or LNMLP.BFloat16, got $dtype")
    Symbol(backend) == :cpu || throw(LNMLPError(LNMLP_ERROR_NOT_SUPPORTED,
        "LNMLP.jl passes host arrays, so only backend=:cpu is supported; got $(repr(backend))"))
    if act_params !== nothing && acts != GATED_PAIRS[:clamped_swiglu]
        argerror("act_params applies only to activations=:clamped_swiglu, but activations is $acts")
    end
    normv, rematv = _choice("norm", norm, _NORMS), _choice("remat", remat, _REMATS)
    recipev = _choice("recipe", recipe, _RECIPES)
    d = Ref{Ptr{Cvoid}}(C_NULL)
    check(lnmlp_desc_create(d))
    h = Ref{Ptr{Cvoid}}(C_NULL)
    try
        desc = d[]
        check(lnmlp_desc_set_shape(desc, tokens, hidden, ffn))
        check(lnmlp_desc_set_norm(desc, normv))
        check(lnmlp_desc_set_zero_centered_gamma(desc, Int32(zero_centered_gamma)))
        check(lnmlp_desc_set_epsilon(desc, Float32(epsilon)))
        actv = Int32[ACTIVATIONS[a] for a in acts]
        GC.@preserve actv check(lnmlp_desc_set_activations(desc, Int32(length(actv)), pointer(actv)))
        if act_params !== nothing
            check(lnmlp_desc_set_clamped_swiglu(desc, Float32(get(act_params, :limit, 7.0)),
                                                Float32(get(act_params, :alpha, 1.702)),
                                                Float32(get(act_params, :offset, 1.0))))
        end
        check(lnmlp_desc_set_bias(desc, Int32(use_bias1), Int32(use_bias2)))
        check(lnmlp_desc_set_dtype(desc, _DTYPES[dtype]))
        check(lnmlp_desc_set_remat(desc, rematv))
        check(lnmlp_desc_set_backend(desc, LNMLP_BACKEND_CPU, Int32(0)))
        check(lnmlp_desc_set_num_threads(desc, Int32(num_threads)))
        check(lnmlp_desc_set_external_workspace(desc, Int32(external_workspace)))
        if sharding !== nothing  # (group_size, rank, sequence_parallel); the library accepts group 1
            g, r, sp = sharding
            check(lnmlp_desc_set_sharding(desc, Int32(g), Int32(r), Int32(Bool(sp))))
        end
        if recipev != LNMLP_RECIPE_NONE
            check(lnmlp_desc_set_recipe(desc, recipev))
            check(lnmlp_desc_set_fp8_format(desc, _choice("fp8_format", fp8_format, _FORMATS)))
            check(lnmlp_desc_set_delayed_scaling(desc, Int32(margin), Int32(amax_history_len),
                                                 _choice("amax_compute_algo", amax_compute_algo, _ALGOS)))
            check(lnmlp_desc_set_scaling_options(desc, Int32(power_2_scale), Float32(amax_epsilon)))
        end
        check(lnmlp_plan_create(desc, h))
    finally
        lnmlp_desc_destroy(d[])  # the plan does not need its descriptor
    end
    p = Plan(h[], Int(tokens), Int(hidden), Int(ffn), Symbol(norm), acts, dtype, use_bias1, use_bias2,
             Symbol(remat), Symbol(recipe), external_workspace, 0, 0, 0, 0, 0, 0, nothing, ReentrantLock())
    finalizer(_finalize, p)  # registered before anything below can throw
    p.workspace_bytes = _query_i64(lnmlp_plan_get_workspace_bytes, p)
    p.saved_bytes = _query_i64(lnmlp_plan_get_saved_bytes, p)
    p.saved_bytes_per_token = _query_i64(lnmlp_plan_get_saved_bytes_per_token, p)
    p.alignment = _query_i64(lnmlp_plan_get_alignment, p)
    p.state_bytes = _query_i64(lnmlp_plan_get_state_bytes, p)
    n = Ref{Int32}(0)
    check(lnmlp_plan_get_amax_history_length(p.handle, n))
    p.amax_history_length = n[]
    return p
end

function _query_i64(f, p::Plan)
    out = Ref{Int64}(0)
    check(f(p.handle, out))
    return Int(out[])
end

# ---- lifetime ---------------------------------------------------------------------------------
# The finalizer takes no lock: it runs only once nothing else references the plan, and a
# finalizer must not wait on a lock (it may not switch tasks).
function _finalize(p::Plan)
    h, p.handle = p.handle, C_NULL
    h == C_NULL || lnmlp_plan_destroy(h)
    return nothing
end

"""`close(plan)` frees the C plan now. Idempotent; later calls on the plan throw LNMLPError."""
Base.close(p::Plan) = lock(() -> _finalize(p), p.lock)
Base.isopen(p::Plan) = p.handle != C_NULL

function _live(p::Plan)
    p.handle == C_NULL &&
        throw(LNMLPError(LNMLP_ERROR_INVALID_HANDLE, "this LNMLP.Plan is closed; create a new Plan"))
    return p.handle
end

Base.show(io::IO, p::Plan) = print(io, "LNMLP.Plan(tokens=$(p.tokens), hidden=$(p.hidden), ffn=$(p.ffn), ",
    "norm=:$(p.norm), activations=$(p.activations), dtype=$(p.dtype), use_bias1=$(p.use_bias1), ",
    "use_bias2=$(p.use_bias2), remat=:$(p.remat), recipe=:$(p.recipe))", isopen(p) ? "" : " [closed]")

# ---- argument checks (the C API sees only pointers, so shapes are checked here) -----------------
function _arr(p::Plan, name, a, shapes...)
    a === nothing && throw(LNMLPError(LNMLP_ERROR_NULL_POINTER, "$name is nothing, but this plan needs it"))
    a isa Array || argerror("$name must be an Array (dense, column-major), got $(typeof(a))")
    eltype(a) == p.dtype || argerror("$name has element type $(eltype(a)), but the plan's dtype is $(p.dtype)")
    any(s -> size(a) == s, shapes) ||
        argerror("$name has size $(size(a)), but the plan needs $(join(shapes, " or ")) " *
                 "(the C shape reversed: Julia arrays are column-major)")
    return a
end

# x and dy: (hidden, tokens...) with the trailing dims' product == tokens.
function _tokens_arr(p::Plan, name, a)
    a isa Array && ndims(a) >= 1 && size(a, 1) == p.hidden && length(a) == p.hidden * p.tokens ||
        argerror("$name has size $(a isa AbstractArray ? size(a) : typeof(a)), but the plan needs " *
                 "($(p.hidden), ...) with $(p.tokens) tokens (the product of the trailing dims)")
    return _arr(p, name, a, size(a))
end

_A(p::Plan) = length(p.activations)
_w1(p, w) = _arr(p, "w1", w, (p.ffn, _A(p), p.hidden), (_A(p) == 1 ? ((p.ffn, p.hidden),) : ())...)
_b1shapes(p) = _A(p) == 1 ? ((p.ffn, 1), (p.ffn,)) : ((p.ffn, _A(p)),)  # a vector only when A == 1
_beta(p, b) = p.norm == :rmsnorm ?
    (b === nothing ? nothing : argerror("beta was given, but rmsnorm has no beta; pass nothing")) :
    _arr(p, "beta", b, (p.hidden,))
function _bias(p, name, b, enabled, shapes...)
    enabled && return _arr(p, name, b, shapes...)
    b === nothing || argerror("$name was given, but the plan has use_bias$(name[2:end])=false; pass nothing")
    return nothing
end

_ptr(a) = a === nothing ? C_NULL : Ptr{Cvoid}(pointer(a))

"""
The buffer forward writes and backward reads. It is over-allocated and offset so that its data
is aligned as the plan requires (Julia only guarantees 16-byte alignment for arrays).
"""
struct Saved
    buf::Vector{UInt8}
    offset::Int
    nbytes::Int
end
function Saved(nbytes::Integer, align::Integer)
    buf = Vector{UInt8}(undef, nbytes + align)
    off = Int(mod(-Int(UInt(pointer(buf))), align))  # Julia's GC does not move arrays
    return Saved(buf, off, nbytes)
end
Base.pointer(s::Saved) = Ptr{Cvoid}(pointer(s.buf) + s.offset)

# ---- execution --------------------------------------------------------------------------------
"""
    forward!(y, saved, plan, x, gamma, beta, w1, b1, w2, b2) -> y

`y = act(norm(x) * w1 + b1) * w2 + b2` into `y` (x's size), and `saved` for backward
(`nothing` when the plan saves nothing). beta is `nothing` for rmsnorm; b1/b2 are `nothing`
exactly when the plan has no such bias.
"""
function forward!(y, saved, p::Plan, x, gamma, beta, w1, b1, w2, b2)
    lock(p.lock) do
        h = _live(p)
        _tokens_arr(p, "x", x)
        _arr(p, "y", y, size(x))
        y === x && argerror("y must not be x")
        _arr(p, "gamma", gamma, (p.hidden,))
        _beta(p, beta); _w1(p, w1); _arr(p, "w2", w2, (p.hidden, p.ffn))
        _bias(p, "b1", b1, p.use_bias1, _b1shapes(p)...); _bias(p, "b2", b2, p.use_bias2, (p.hidden,))
        p.saved_bytes == 0 || (saved isa Saved && saved.nbytes == p.saved_bytes) ||
            argerror("saved must be a Saved of $(p.saved_bytes) bytes from this plan")
        sp = p.saved_bytes == 0 ? C_NULL : pointer(saved)
        GC.@preserve x gamma beta w1 b1 w2 b2 y saved begin
            check(lnmlp_plan_forward(h, _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1), _ptr(b1), _ptr(w2),
                                     _ptr(b2), _ptr(y), sp, C_NULL))
        end
    end
    return y
end

"""
    forward(plan, x, gamma, beta, w1, b1, w2, b2) -> (y, saved)

Allocating [`forward!`](@ref): `saved` (or `nothing` for a plan that saves nothing) must be
passed to [`backward`](@ref) with the same x and weights.
"""
function forward(p::Plan, x, gamma, beta, w1, b1, w2, b2)
    _tokens_arr(p, "x", x)
    y = similar(x)
    saved = p.saved_bytes == 0 ? nothing : Saved(p.saved_bytes, max(p.alignment, 1))
    forward!(y, saved, p, x, gamma, beta, w1, b1, w2, b2)
    return y, saved
end

"""
    backward(plan, dy, x, gamma, beta, w1, b1, w2, saved) -> (; dx, dgamma, dbeta, dw1, db1, dw2, db2)

Gradients given `dy = dL/dy` and forward's `saved`. `dbeta` is `nothing` for rmsnorm; `db1`/`db2`
are `nothing` when the bias is disabled. `b1` is read only with `remat=:save_stats`.
"""
function backward(p::Plan, dy, x, gamma, beta, w1, b1, w2, saved)
    lock(p.lock) do
        h = _live(p)
        p.remat == :forward_only && throw(LNMLPError(LNMLP_ERROR_INVALID_ARGUMENT,
            "this plan has remat=:forward_only, so it has no backward"))
        _tokens_arr(p, "x", x)
        _arr(p, "dy", dy, size(x))
        _arr(p, "gamma", gamma, (p.hidden,))
        _beta(p, beta); _w1(p, w1); _arr(p, "w2", w2, (p.hidden, p.ffn))
        b1 === nothing || _bias(p, "b1", b1, p.use_bias1, _b1shapes(p)...)
        saved isa Saved && saved.nbytes == p.saved_bytes ||
            argerror("saved must be the Saved that this plan's forward returned")
        dx = similar(x)
        dgamma = similar(gamma)
        dbeta = p.norm == :rmsnorm ? nothing : similar(gamma)
        dw1 = similar(w1)
        db1 = p.use_bias1 ? zeros(p.dtype, p.ffn, _A(p)) : nothing
        dw2 = similar(w2)
        db2 = p.use_bias2 ? similar(gamma) : nothing
        GC.@preserve dy x gamma beta w1 b1 w2 saved dx dgamma dbeta dw1 db1 dw2 db2 begin
            check(lnmlp_plan_backward(h, _ptr(dy), _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1), _ptr(b1),
                                      _ptr(w2), pointer(saved), _ptr(dx), _ptr(dgamma), _ptr(dbeta), _ptr(dw1),
                                      _ptr(db1), _ptr(dw2), _ptr(db2), C_NULL))
        end
        return (; dx, dgamma, dbeta, dw1, db1, dw2, db2)
    end
end

"""
    attach_workspace!(plan, buf::Vector{UInt8})

For a plan created with `external_workspace=true`: attaches caller memory of at least
`plan.workspace_bytes` bytes, aligned to `plan.alignment` (allocate it with
`LNMLP.aligned_workspace(plan)`). The plan keeps `buf` alive while attached.
"""
function attach_workspace!(p::Plan, buf::Vector{UInt8}, offset::Integer=0)
    lock(p.lock) do
        h = _live(p)
        0 <= offset <= length(buf) || argerror("offset $offset is outside the buffer")
        GC.@preserve buf check(lnmlp_plan_attach_workspace(h, Ptr{Cvoid}(pointer(buf) + offset),
                                                           Int64(length(buf) - offset)))
        p.workspace = buf
    end
    return p
end

"""`(buf, offset)`: a buffer whose data from `offset` is aligned and large enough for `plan`."""
function aligned_workspace(p::Plan)
    s = Saved(p.workspace_bytes, max(p.alignment, 1))
    return s.buf, s.offset
end

# ---- capability queries -------------------------------------------------------------------------
"""The library's human-readable build description (`lnmlp_get_build_info`)."""
function build_info()
    ensure_loaded()
    s = Ref{Ptr{UInt8}}(C_NULL)
    check(lnmlp_get_build_info(s))
    return unsafe_string(s[])
end

const _FEATURES = Dict(:backend => LNMLP_FEATURE_BACKEND, :dtype_f32 => LNMLP_FEATURE_DTYPE_F32,
    :dtype_bf16 => LNMLP_FEATURE_DTYPE_BF16, :dtype_f16 => LNMLP_FEATURE_DTYPE_F16,
    :recipe_delayed => LNMLP_FEATURE_RECIPE_DELAYED, :recipe_current => LNMLP_FEATURE_RECIPE_CURRENT,
    :recipe_block => LNMLP_FEATURE_RECIPE_BLOCK, :recipe_mxfp8 => LNMLP_FEATURE_RECIPE_MXFP8,
    :sharding => LNMLP_FEATURE_SHARDING, :external_workspace => LNMLP_FEATURE_EXTERNAL_WORKSPACE)

"""`query_support(backend=:cpu, feature=:backend)`: whether this build can run `feature` here."""
function query_support(backend=:cpu, feature=:backend)
    ensure_loaded()
    b = _choice("backend", backend, Dict(:cpu => LNMLP_BACKEND_CPU, :cuda => LNMLP_BACKEND_CUDA))
    out = Ref{Int32}(0)
    check(lnmlp_query_support(b, _choice("feature", feature, _FEATURES), out))
    return out[] != 0  # LNMLP_SUPPORTED, or LNMLP_SUPPORTED_EMULATED for an FP8 recipe
end
