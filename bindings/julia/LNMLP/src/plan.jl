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
const _WEIGHT_LAYOUTS = Dict(:in_out => LNMLP_WEIGHT_LAYOUT_IN_OUT, :out_in => LNMLP_WEIGHT_LAYOUT_OUT_IN)
const _RECIPES = Dict(:none => LNMLP_RECIPE_NONE, :delayed => LNMLP_RECIPE_DELAYED,
                      :current => LNMLP_RECIPE_CURRENT, :block => LNMLP_RECIPE_BLOCK, :mxfp8 => LNMLP_RECIPE_MXFP8,
                      :nvfp4 => LNMLP_RECIPE_NVFP4)
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
         power_2_scale=-1, amax_epsilon=0.0, disable_rht=false, disable_stochastic_rounding=false,
         disable_2d_quantization=false, accumulate_grads=false, grad_dtype=nothing,
         weight_dtype=nothing, weight_layout=:in_out)

Validates and allocates a fused block (`lnmlp_plan_create`). `activations` is a name (`:gelu`, or a
pair name such as `:swiglu`) or a tuple of 1 or 2 names; `act_params` is `(limit=, alpha=, offset=)`
for `:clamped_swiglu`; `dtype` is `Float32`, `Float16` or [`BFloat16`](@ref); `recipe` is one of
`:none, :delayed, :current, :block, :mxfp8, :nvfp4` with the options of `lnmlp_desc_set_*`
(`disable_*`: `lnmlp_desc_set_nvfp4_options`; `:nvfp4`'s stochastic rounding draws from the plan's
random state, [`rng_state`](@ref) / [`set_rng_state!`](@ref)).
Only the CPU backend (host arrays) is supported by this binding.

Experimental (lnmlp.h's experimental tier; it may change in any release):
`sharding=(group_size, rank, sequence_parallel)` (`lnmlp_desc_set_sharding`); the plan also needs
a communicator, which only the raw `lnmlp_comm_create_*` / `lnmlp_desc_set_communicator` give.

The weight gradients dW1, db1, dW2, db2 (`lnmlp_desc_set_weight_gradients`): with
`accumulate_grads=true` backward adds into them (each element `rnd(old + gradient)`) instead of
overwriting them, for gradient accumulation over micro-batches; use [`backward!`](@ref) with your
gradient arrays (from [`new_grads`](@ref)) then, since the allocating `backward` is refused.
`grad_dtype` is their element type: `nothing` (the plan's `dtype`) or `Float32` (fp32 "main
grads" of a `Float16` / `BFloat16` plan); the library refuses any other at plan creation.
`plan.grad_dtype` is the type the library reports. dgamma, dbeta and dx are always overwritten,
in `dtype`.

`weight_layout` (`lnmlp_desc_set_weight_layout`) is how w1 and w2 (and dw1, dw2) are laid out:
`:in_out` (the default: C's W1 [H, A, F] and W2 [F, H], Julia arrays (F, A, H) and (H, F)) or
`:out_in` (C's W1 [A, F, H] and W2 [H, F], PyTorch's: Julia arrays (H, F, A) and (F, H)); both
compute the same block, and [`tensor_shape`](@ref) reports the shapes.

`weight_dtype` is the element type of w1 and w2 (`lnmlp_desc_set_weight_dtype`): `nothing` (the
plan's `dtype`) or `Float32` (fp32 master weights of a `Float16` / `BFloat16` plan, which only an
FP8 `recipe` accepts: it quantizes them directly; without one plan creation throws
`LNMLP_ERROR_NOT_SUPPORTED`); the library refuses any other. b1, b2, gamma and beta stay in
`dtype`. `plan.weight_dtype` is the type the library reports, which forward and backward check
w1 and w2 against.

`tokens` is the most tokens one call takes (`plan.max_tokens`: this rank's rows under sequence
parallelism): each [`forward`](@ref) / [`backward`](@ref) takes an `x` with any number of tokens
from 0 to it. The size of every tensor of a call is [`tensor_shape`](@ref)`(plan, tensor; tokens)`.

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
    max_tokens::Int                          # the most tokens of one call (x's trailing dims)
    accumulate_grads::Bool                   # backward adds into dw1, db1, dw2, db2
    grad_dtype::DataType                     # element type of dw1, db1, dw2, db2 (the shape query's)
    weight_dtype::DataType                   # element type of w1, w2 (the shape query's)
    workspace::Union{Nothing,Vector{UInt8}}  # attached caller workspace, kept alive by the plan
    fp8_state::Union{Nothing,Array{Float32}} # attached caller FP8 state, kept alive by the plan
    lock::ReentrantLock
end

function Plan(tokens::Integer, hidden::Integer, ffn::Integer; norm=:layernorm, zero_centered_gamma::Bool=false,
              epsilon::Real=1e-6, activations=(:relu,), act_params=nothing, use_bias1::Bool=false,
              use_bias2::Bool=false, dtype::Type=Float32, remat=:save_all, num_threads::Integer=0,
              backend=:cpu, external_workspace::Bool=false, recipe=:none, fp8_format=:default,
              margin::Integer=0, amax_history_len::Integer=1024, amax_compute_algo=:max,
              power_2_scale::Integer=-1, amax_epsilon::Real=0.0, disable_rht::Bool=false,
              disable_stochastic_rounding::Bool=false, disable_2d_quantization::Bool=false, sharding=nothing,
              accumulate_grads::Bool=false, grad_dtype::Union{Nothing,Type}=nothing,
              weight_dtype::Union{Nothing,Type}=nothing, weight_layout=:in_out)
    ensure_loaded()
    acts = _activations(activations)
    haskey(_DTYPES, dtype) || argerror("dtype must be Float32, Float16 or LNMLP.BFloat16, got $dtype")
    Symbol(backend) == :cpu || throw(LNMLPError(LNMLP_ERROR_NOT_SUPPORTED,
        "LNMLP.jl passes host arrays, so only backend=:cpu is supported; got $(repr(backend))"))
    if act_params !== nothing && acts != GATED_PAIRS[:clamped_swiglu]
        argerror("act_params applies only to activations=:clamped_swiglu, but activations is $acts")
    end
    normv, rematv = _choice("norm", norm, _NORMS), _choice("remat", remat, _REMATS)
    layoutv = _choice("weight_layout", weight_layout, _WEIGHT_LAYOUTS)
    recipev = _choice("recipe", recipe, _RECIPES)
    grad_dtype === nothing || haskey(_DTYPES, grad_dtype) ||
        argerror("grad_dtype must be nothing or the plan's dtype ($dtype), or Float32; got $grad_dtype")
    gradv = grad_dtype === nothing ? Int32(-1) : _DTYPES[grad_dtype]
    weight_dtype === nothing || haskey(_DTYPES, weight_dtype) ||
        argerror("weight_dtype must be nothing or the plan's dtype ($dtype), or Float32; got $weight_dtype")
    weightv = weight_dtype === nothing ? Int32(-1) : _DTYPES[weight_dtype]
    # the library says what it accepts within int64 (as the Python binding, num_threads here)
    tokens, hidden, ffn = _int_in("tokens", tokens, _INT64...), _int_in("hidden", hidden, _INT64...),
                          _int_in("ffn", ffn, _INT64...)
    num_threads = _int_in("num_threads", num_threads, Int64(0), Int64(65536))
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
        GC.@preserve actv check(lnmlp_desc_set_activations(desc, Int64(length(actv)), pointer(actv)))
        if act_params !== nothing
            check(lnmlp_desc_set_clamped_swiglu(desc, Float32(get(act_params, :limit, 7.0)),
                                                Float32(get(act_params, :alpha, 1.702)),
                                                Float32(get(act_params, :offset, 1.0))))
        end
        check(lnmlp_desc_set_bias(desc, Int32(use_bias1), Int32(use_bias2)))
        check(lnmlp_desc_set_dtype(desc, _DTYPES[dtype]))
        check(lnmlp_desc_set_weight_gradients(desc, Int32(accumulate_grads), gradv))
        check(lnmlp_desc_set_weight_dtype(desc, weightv))
        check(lnmlp_desc_set_weight_layout(desc, layoutv))
        check(lnmlp_desc_set_remat(desc, rematv))
        check(lnmlp_desc_set_backend(desc, LNMLP_BACKEND_CPU, Int32(0)))
        check(lnmlp_desc_set_num_threads(desc, num_threads))
        check(lnmlp_desc_set_external_workspace(desc, Int32(external_workspace)))
        if sharding !== nothing  # experimental: (group_size, rank, sequence_parallel); the library accepts group 1
            g, r, sp = sharding
            check(lnmlp_desc_set_sharding(desc, _int_in("sharding's group_size", g, _INT64...),
                                          _int_in("sharding's rank", r, _INT64...), Int32(Bool(sp))))
        end
        if recipev != LNMLP_RECIPE_NONE
            check(lnmlp_desc_set_recipe(desc, recipev))
            check(lnmlp_desc_set_fp8_format(desc, _choice("fp8_format", fp8_format, _FORMATS)))
            check(lnmlp_desc_set_delayed_scaling(desc, _int_in("margin", margin, _INT32...),
                                                 _int_in("amax_history_len", amax_history_len, _INT64...),
                                                 _choice("amax_compute_algo", amax_compute_algo, _ALGOS)))
            check(lnmlp_desc_set_scaling_options(desc, _int_in("power_2_scale", power_2_scale, _INT32...),
                                                 Float32(amax_epsilon)))
            check(lnmlp_desc_set_nvfp4_options(desc, Int32(disable_rht), Int32(disable_stochastic_rounding),
                                               Int32(disable_2d_quantization)))
        end
        check(lnmlp_plan_create(desc, h))
    finally
        lnmlp_desc_destroy(d[])  # the plan does not need its descriptor
    end
    p = Plan(h[], Int(tokens), Int(hidden), Int(ffn), Symbol(norm), acts, dtype, use_bias1, use_bias2,
             Symbol(remat), Symbol(recipe), external_workspace, 0, 0, 0, 0, 0, 0, 0, accumulate_grads, dtype,
             dtype, nothing, nothing, ReentrantLock())
    finalizer(_finalize, p)  # registered before anything below can throw
    p.workspace_bytes = _query_i64(lnmlp_plan_get_workspace_bytes, p)
    p.saved_bytes = _query_i64(lnmlp_plan_get_saved_bytes, p)
    p.saved_bytes_per_token = _query_i64(lnmlp_plan_get_saved_bytes_per_token, p)
    p.alignment = _query_i64(lnmlp_plan_get_alignment, p)
    p.state_bytes = _query_i64(lnmlp_plan_get_state_bytes, p)  # experimental (the state blob)
    p.amax_history_length = _query_i64(lnmlp_plan_get_amax_history_length, p)
    p.max_tokens = _shape(p.handle, LNMLP_TENSOR_X)[2]  # x is (hidden, tokens)
    p.grad_dtype = _shape_type(p.handle, LNMLP_TENSOR_DW1)[2]  # dW1 is always taken
    p.weight_dtype = _shape_type(p.handle, LNMLP_TENSOR_W1)[2]  # W1 too
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
    "use_bias2=$(p.use_bias2), remat=:$(p.remat), recipe=:$(p.recipe)",
    p.accumulate_grads ? ", accumulate_grads=true" : "", p.grad_dtype == p.dtype ? "" : ", grad_dtype=$(p.grad_dtype)",
    p.weight_dtype == p.dtype ? "" : ", weight_dtype=$(p.weight_dtype)", ")", isopen(p) ? "" : " [closed]")

# ---- shapes (lnmlp_plan_get_tensor_shape) ------------------------------------------------------
const TENSORS = Dict(:x => LNMLP_TENSOR_X, :gamma => LNMLP_TENSOR_GAMMA, :beta => LNMLP_TENSOR_BETA,
                     :w1 => LNMLP_TENSOR_W1, :b1 => LNMLP_TENSOR_B1, :w2 => LNMLP_TENSOR_W2, :b2 => LNMLP_TENSOR_B2,
                     :y => LNMLP_TENSOR_Y, :saved => LNMLP_TENSOR_SAVED, :dy => LNMLP_TENSOR_DY,
                     :dx => LNMLP_TENSOR_DX, :dgamma => LNMLP_TENSOR_DGAMMA, :dbeta => LNMLP_TENSOR_DBETA,
                     :dw1 => LNMLP_TENSOR_DW1, :db1 => LNMLP_TENSOR_DB1, :dw2 => LNMLP_TENSOR_DW2,
                     :db2 => LNMLP_TENSOR_DB2, :fp8_state => LNMLP_TENSOR_FP8_STATE)

# LNMLP_DTYPE_U8 is the element type of the saved buffer only (F32, BF16, F16 are the plan's I/O
# types; the FP8_* ones are fp8_encode's, never a tensor's).
const _ELTYPES = Dict{Int32,DataType}(LNMLP_DTYPE_F32 => Float32, LNMLP_DTYPE_BF16 => BFloat16,
                                       LNMLP_DTYPE_F16 => Float16, LNMLP_DTYPE_U8 => UInt8)

# (size, element type) of `tensor` in a call with `tokens` tokens: the C shape reversed
# (column-major), or (nothing, nothing) when the plan does not take the tensor (C rank -1). Every
# size and type the binding checks or allocates comes from here, so sharded plans get their
# shards' shapes. `dims` holds LNMLP_MAX_TENSOR_RANK values (W1: [H, A, F] in C); `tokens` is
# LNMLP_TOKENS_MAX (-1) for the plan's most tokens.
function _shape_type(h::Ptr{Cvoid}, tensor::Integer, tokens::Integer=LNMLP_TOKENS_MAX)
    rank, dtype = Ref{Int64}(0), Ref{Int32}(0)  # int64_t* rank, int32_t* dtype
    dims = zeros(Int64, LNMLP_MAX_TENSOR_RANK)
    GC.@preserve dims check(lnmlp_plan_get_tensor_shape(h, Int32(tensor), Int64(tokens), rank, pointer(dims),
                                                        dtype))
    rank[] < 0 && return (nothing, nothing)
    return (Tuple(Int(dims[k]) for k in rank[]:-1:1), _ELTYPES[dtype[]])
end
_shape(h::Ptr{Cvoid}, tensor::Integer, tokens::Integer=LNMLP_TOKENS_MAX) = _shape_type(h, tensor, tokens)[1]

"""
    tensor_shape(plan, tensor; tokens=nothing) -> Union{Tuple, Nothing}

The size of the array `plan` takes as `tensor` (`:x, :gamma, :beta, :w1, :b1, :w2, :b2, :y, :saved,
:dy, :dx, :dgamma, :dbeta, :dw1, :db1, :dw2, :db2, :fp8_state`) in a call with `tokens` tokens
(`nothing`: the plan's most), in this binding's layout (the C shape reversed): `x` is
`(hidden, tokens)`, `w1` `(ffn, A, hidden)`, `:saved` `(bytes,)`, `:fp8_state`
`(1 + amax_history_len, 6)`. `nothing` when the plan does not take the tensor (pass `nothing`).
"""
function tensor_shape(p::Plan, tensor; tokens::Union{Nothing,Integer}=nothing)
    lock(p.lock) do
        _shape(_live(p), _choice("tensor", tensor, TENSORS),
               tokens === nothing ? LNMLP_TOKENS_MAX : _int_in("tokens", tokens, _INT64...))
    end
end

# ---- argument checks (the C API sees only pointers, so shapes are checked here) -----------------
function _arr(p::Plan, name, a, shapes...; T::Type=p.dtype)
    a === nothing && throw(LNMLPError(LNMLP_ERROR_NULL_POINTER, "$name is nothing, but this plan needs it"))
    a isa Array || argerror("$name must be an Array (dense, column-major), got $(typeof(a))")
    eltype(a) == T || argerror("$name has element type $(eltype(a)), but the plan needs $T")
    any(s -> size(a) == s, shapes) ||
        argerror("$name has size $(size(a)), but the plan needs $(join(shapes, " or ")) " *
                 "(the C shape reversed: Julia arrays are column-major)")
    return a
end

# x and dy: (hidden, tokens...), the call's tokens being the product of the trailing dims (0 up to
# plan.max_tokens). Returns that count. A count above the plan's most is passed on to the library,
# whose error names the limit.
function _tokens_arr(p::Plan, name, a)
    a isa Array && ndims(a) >= 1 && size(a, 1) == p.hidden ||
        argerror("$name has size $(a isa AbstractArray ? size(a) : typeof(a)), but the plan needs " *
                 "($(p.hidden), ...) with 0 to $(p.max_tokens) tokens (the product of the trailing dims)")
    _arr(p, name, a, size(a))
    return length(a) ÷ p.hidden
end

# Where the call is in range, the query's own tokens; else the plan's most (the C call then fails).
_query_tokens(p::Plan, t) = 0 <= t <= p.max_tokens ? t : LNMLP_TOKENS_MAX

const _WHY_ABSENT = Dict("beta" => "norm=:rmsnorm has no beta", "b1" => "the plan has use_bias1=false",
                         "b2" => "the plan has use_bias2=false")

# A weight-sized tensor (or fp8_state): checked against the shape and element type the library
# gives, or `nothing` when the plan does not take it. W1 and b1 may leave out their A dimension
# when A = 1 ((ffn, hidden) and (ffn,)).
function _param(p::Plan, h, name, a, tensor)
    s, T = _shape_type(h, tensor)
    if s === nothing
        a === nothing && return nothing
        why = name == "fp8_state" ? "recipe=:$(p.recipe) keeps no FP8 state; only :delayed does" :
                                    get(_WHY_ABSENT, name, "the plan does not take it")
        argerror("$name was given, but $why; pass nothing")
    end
    return _arr(p, name, a, _sizes(tensor, s)...; T)
end
_sizes(tensor, s) = tensor in (LNMLP_TENSOR_W1, LNMLP_TENSOR_B1) && s[2] == 1 ? (s, (s[1], s[3:end]...)) : (s,)

# A new gradient array of `tensor`'s shape (`nothing` when the plan has no such gradient), laid
# out as its parameter `like` was given (W1 / b1 without the A dimension).
function _output(p::Plan, h, tensor, like=nothing)
    s, T = _shape_type(h, tensor)
    s === nothing && return nothing
    a = Array{T}(undef, s)
    return like === nothing || size(like) == s ? a : reshape(a, size(like))
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

# The saved pointer of a call with t tokens: a Saved of at least the bytes the shape query gives
# for t (a buffer for more tokens serves too); C_NULL when the plan saves nothing, and for t = 0
# when none was given (the library then reads and writes no saved state).
function _saved_ptr(p::Plan, h, saved, t, what)
    s = _shape(h, LNMLP_TENSOR_SAVED, _query_tokens(p, t))
    s === nothing && return C_NULL
    saved === nothing && t == 0 && return C_NULL
    saved isa Saved && saved.nbytes >= s[1] || argerror("saved must be $what (a Saved of at least $(s[1]) bytes)")
    return pointer(saved)
end

# fp8_state: a caller's Float32 (1 + amax_history_len, 6) array for this call only, or C_NULL (the
# plan's state: attached or its own).
_fp8_ptr(p::Plan, h, state) =
    state === nothing ? C_NULL : _ptr(_param(p, h, "fp8_state", state, LNMLP_TENSOR_FP8_STATE))

# ---- execution --------------------------------------------------------------------------------
# The call's flags (LNMLP_CALL_*, OR'ed): LNMLP_CALL_WEIGHTS_UNCHANGED says w1 / w2 are as when
# the plan made its copies of them, so the call reuses those copies (see forward!'s docstring).
_flags(weights_unchanged::Bool) = weights_unchanged ? LNMLP_CALL_WEIGHTS_UNCHANGED : LNMLP_CALL_DEFAULT

"""
    forward!(y, saved, plan, x, gamma, beta, w1, b1, w2, b2; fp8_state=nothing, weights_unchanged=false) -> y

`y = act(norm(x) * w1 + b1) * w2 + b2` into `y` (x's size), and `saved` for backward
(`nothing` when the plan saves nothing). `x` is `(hidden, tokens...)` with any number of tokens
from 0 to `plan.max_tokens`. beta is `nothing` for rmsnorm; b1/b2 are `nothing` exactly when the
plan has no such bias. `fp8_state` (recipe=:delayed only): a Float32 array of
`tensor_shape(plan, :fp8_state)` used and updated in place instead of the plan's state, for this call.

`weights_unchanged=true` (`LNMLP_CALL_WEIGHTS_UNCHANGED`, TransformerEngine's
`is_first_microbatch=false`): `w1` and `w2` hold the values they had when the plan last made its
copies of them (the widened copies of a Float16 plan, the FP8-quantized ones with their scales),
so the call reuses those copies instead of making them again: for the micro-batches after the
first, and for the backward of a forward with the same weights. If they did change, the call
computes with the old copies. A call without it makes the copies afresh.
"""
function forward!(y, saved, p::Plan, x, gamma, beta, w1, b1, w2, b2; fp8_state=nothing,
                  weights_unchanged::Bool=false)
    lock(p.lock) do
        h = _live(p)
        t = _tokens_arr(p, "x", x)
        _arr(p, "y", y, size(x))
        y === x && argerror("y must not be x")
        _param(p, h, "gamma", gamma, LNMLP_TENSOR_GAMMA); _param(p, h, "beta", beta, LNMLP_TENSOR_BETA)
        _param(p, h, "w1", w1, LNMLP_TENSOR_W1); _param(p, h, "w2", w2, LNMLP_TENSOR_W2)
        _param(p, h, "b1", b1, LNMLP_TENSOR_B1); _param(p, h, "b2", b2, LNMLP_TENSOR_B2)
        sp = _saved_ptr(p, h, saved, t, "a Saved from forward(plan, ...) for $t or more tokens")
        fp = _fp8_ptr(p, h, fp8_state)
        GC.@preserve x gamma beta w1 b1 w2 b2 y saved fp8_state begin
            check(lnmlp_plan_forward(h, Int64(t), _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1), _ptr(b1), _ptr(w2),
                                     _ptr(b2), _ptr(y), sp, fp, _flags(weights_unchanged), C_NULL))
        end
    end
    return y
end

"""
    forward(plan, x, gamma, beta, w1, b1, w2, b2; fp8_state=nothing, weights_unchanged=false) -> (y, saved)

Allocating [`forward!`](@ref): `y` has x's size; `saved` (sized for x's tokens, or `nothing` for a
plan that saves nothing) must be passed to [`backward`](@ref) with the same x and weights.
"""
function forward(p::Plan, x, gamma, beta, w1, b1, w2, b2; fp8_state=nothing, weights_unchanged::Bool=false)
    lock(p.lock) do
        h = _live(p)
        t = _tokens_arr(p, "x", x)
        s = _shape(h, LNMLP_TENSOR_SAVED, _query_tokens(p, t))
        saved = s === nothing ? nothing : Saved(s[1], max(p.alignment, 1))
        y = similar(x)  # Y's shape is X's: (hidden, t), here in x's own trailing dims
        forward!(y, saved, p, x, gamma, beta, w1, b1, w2, b2; fp8_state, weights_unchanged)
        return y, saved
    end
end

"""
    backward(plan, dy, x, gamma, beta, w1, b1, w2, saved; fp8_state=nothing, weights_unchanged=false)
        -> (; dx, dgamma, dbeta, dw1, db1, dw2, db2)

Gradients given `dy = dL/dy` and forward's `saved` (the forward with the same x, so the same
tokens), in new arrays: dW1, db1, dW2, db2 of `plan.grad_dtype`, the others of `plan.dtype`.
`dbeta` is `nothing` for rmsnorm; `db1`/`db2` are `nothing` when the bias is disabled.
`b1` is read only with `remat=:save_stats`. With 0 tokens the parameter gradients are zeros.
`fp8_state` and `weights_unchanged` as for [`forward!`](@ref). Refused for a plan with
`accumulate_grads=true`: give it the arrays to add into with [`backward!`](@ref).
"""
function backward(p::Plan, dy, x, gamma, beta, w1, b1, w2, saved; fp8_state=nothing,
                  weights_unchanged::Bool=false)
    lock(p.lock) do
        h = _live(p)
        p.accumulate_grads && argerror("this plan has accumulate_grads=true: backward would add into new " *
            "arrays; pass the gradients to add into with backward!(grads, plan, ...) (see new_grads)")
        t = _tokens_arr(p, "x", x)
        grads = (; dx=similar(x),  # DX's shape is X's
                 dgamma=_output(p, h, LNMLP_TENSOR_DGAMMA), dbeta=_output(p, h, LNMLP_TENSOR_DBETA),
                 dw1=_output(p, h, LNMLP_TENSOR_DW1, w1), db1=_output(p, h, LNMLP_TENSOR_DB1),
                 dw2=_output(p, h, LNMLP_TENSOR_DW2), db2=_output(p, h, LNMLP_TENSOR_DB2))
        return _backward!(grads, p, h, t, dy, x, gamma, beta, w1, b1, w2, saved, fp8_state, weights_unchanged)
    end
end

"""
    backward!(grads, plan, dy, x, gamma, beta, w1, b1, w2, saved; fp8_state=nothing,
              weights_unchanged=false) -> grads

[`backward`](@ref) into the caller's arrays `grads`, a NamedTuple `(; dx, dgamma, dbeta, dw1,
db1, dw2, db2)` as [`new_grads`](@ref) and `backward` return (`nothing` for the gradients the plan
does not have). `dx` has x's size; dgamma, dbeta and dx are overwritten; dW1, db1, dW2, db2 are
overwritten, or added into when the plan has `accumulate_grads=true` (then with 0 tokens they
stay as they are). Every array's size and element type is checked against the library's shape
query before C is called: dW1, db1, dW2, db2 must be of `plan.grad_dtype` (e.g. `Float32` for a
`BFloat16` plan with `grad_dtype=Float32`), the others of `plan.dtype`.
"""
function backward!(grads, p::Plan, dy, x, gamma, beta, w1, b1, w2, saved; fp8_state=nothing,
                   weights_unchanged::Bool=false)
    lock(p.lock) do
        h = _live(p)
        t = _tokens_arr(p, "x", x)
        _backward!(grads, p, h, t, dy, x, gamma, beta, w1, b1, w2, saved, fp8_state, weights_unchanged)
    end
    return grads
end

function _backward!(grads, p::Plan, h, t, dy, x, gamma, beta, w1, b1, w2, saved, fp8_state, weights_unchanged)
    p.remat == :forward_only && throw(LNMLPError(LNMLP_ERROR_INVALID_ARGUMENT,
        "this plan has remat=:forward_only, so it has no backward"))
    _arr(p, "dy", dy, size(x))
    _param(p, h, "gamma", gamma, LNMLP_TENSOR_GAMMA); _param(p, h, "beta", beta, LNMLP_TENSOR_BETA)
    _param(p, h, "w1", w1, LNMLP_TENSOR_W1); _param(p, h, "w2", w2, LNMLP_TENSOR_W2)
    b1 === nothing || _param(p, h, "b1", b1, LNMLP_TENSOR_B1)
    sp = _saved_ptr(p, h, saved, t, "the Saved that this plan's forward returned for these $t tokens")
    fp = _fp8_ptr(p, h, fp8_state)
    dx, dgamma, dbeta = grads.dx, grads.dgamma, grads.dbeta
    dw1, db1, dw2, db2 = grads.dw1, grads.db1, grads.dw2, grads.db2
    _arr(p, "dx", dx, size(x))
    _param(p, h, "dgamma", dgamma, LNMLP_TENSOR_DGAMMA); _param(p, h, "dbeta", dbeta, LNMLP_TENSOR_DBETA)
    _param(p, h, "dw1", dw1, LNMLP_TENSOR_DW1); _param(p, h, "db1", db1, LNMLP_TENSOR_DB1)
    _param(p, h, "dw2", dw2, LNMLP_TENSOR_DW2); _param(p, h, "db2", db2, LNMLP_TENSOR_DB2)
    outs = Any[dx, dgamma, dbeta, dw1, db1, dw2, db2]
    ins = Any[dy, x, gamma, beta, w1, b1, w2]
    for (i, o) in enumerate(outs)  # outputs must not overlap each other or the inputs (C's rule)
        o === nothing && continue
        any(a -> a === o, ins) && argerror("a gradient array is also an input of backward; pass its own array")
        any(j -> outs[j] === o, 1:i-1) && argerror("two gradients share one array; give each its own")
    end
    GC.@preserve dy x gamma beta w1 b1 w2 saved fp8_state dx dgamma dbeta dw1 db1 dw2 db2 begin
        check(lnmlp_plan_backward(h, Int64(t), _ptr(dy), _ptr(x), _ptr(gamma), _ptr(beta), _ptr(w1), _ptr(b1),
                                  _ptr(w2), sp, _ptr(dx), _ptr(dgamma), _ptr(dbeta), _ptr(dw1),
                                  _ptr(db1), _ptr(dw2), _ptr(db2), fp, _flags(weights_unchanged), C_NULL))
    end
    return grads
end

"""
    new_grads(plan; tokens=plan.max_tokens) -> (; dx, dgamma, dbeta, dw1, db1, dw2, db2)

Zeroed gradient arrays for [`backward!`](@ref) with `tokens` tokens, of the sizes and element
types the library's shape query gives (dW1, db1, dW2, db2 of `plan.grad_dtype`; `nothing` for the
gradients the plan does not have). `dx` is `(hidden, tokens)`: pass a new `dx` of x's size for
another token count, e.g. `merge(grads, (; dx=similar(x)))`; the weight gradients can stay the
same arrays, to accumulate into.
"""
function new_grads(p::Plan; tokens::Union{Nothing,Integer}=nothing)
    lock(p.lock) do
        h = _live(p)
        t = tokens === nothing ? LNMLP_TOKENS_MAX : _int_in("tokens", tokens, _INT64...)
        z(tensor) = (st = _shape_type(h, tensor, t); st[1] === nothing ? nothing : zeros(st[2], st[1]))
        return (; dx=z(LNMLP_TENSOR_DX), dgamma=z(LNMLP_TENSOR_DGAMMA), dbeta=z(LNMLP_TENSOR_DBETA),
                dw1=z(LNMLP_TENSOR_DW1), db1=z(LNMLP_TENSOR_DB1), dw2=z(LNMLP_TENSOR_DW2),
                db2=z(LNMLP_TENSOR_DB2))
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
    :recipe_nvfp4 => LNMLP_FEATURE_RECIPE_NVFP4, :sharding => LNMLP_FEATURE_SHARDING, :external_workspace => LNMLP_FEATURE_EXTERNAL_WORKSPACE)

"""
    query_support(backend=:cpu, feature=:backend)

Whether this build can run `feature` here. `backend=:cuda` and `feature=:sharding` are
experimental (`LNMLP_BACKEND_CUDA`, `LNMLP_FEATURE_SHARDING`: lnmlp.h's experimental tier).
"""
function query_support(backend=:cpu, feature=:backend)
    ensure_loaded()
    b = _choice("backend", backend, Dict(:cpu => LNMLP_BACKEND_CPU, :cuda => LNMLP_BACKEND_CUDA))
    out = Ref{Int32}(0)
    check(lnmlp_query_support(b, _choice("feature", feature, _FEATURES), out))
    return out[] != 0  # LNMLP_SUPPORTED, or LNMLP_SUPPORTED_EMULATED for an FP8 recipe
end
