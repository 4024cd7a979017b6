# The raw C API: one Julia function per function of include/lnmlp.h, same name, same arguments,
# returning what C returns (an Int32 status, or a Cstring for the two string functions).
# No checks and no GC rooting beyond ccall's own conversion: callers that pass `pointer(array)`
# must wrap the call in `GC.@preserve array` (plan.jl and fp8.jl do).
#
# Type mapping (checked against the header by tools/check_julia_bindings.py):
#   int32_t -> Int32, int64_t -> Int64, float -> Float32, T* -> Ptr{T} (also accepts a Ref{T} or
#   an Array{T}), lnmlp_desc* / lnmlp_plan* / void* -> Ptr{Cvoid}, const char* -> Cstring.

# ---- versions, status, errors, capabilities ----
lnmlp_get_version(major, minor, patch, abi) =
    ccall((:lnmlp_get_version, liblnmlp), Int32, (Ptr{Int32}, Ptr{Int32}, Ptr{Int32}, Ptr{Int32}),
          major, minor, patch, abi)
lnmlp_status_string(status) = ccall((:lnmlp_status_string, liblnmlp), Cstring, (Int32,), status)
lnmlp_last_error() = ccall((:lnmlp_last_error, liblnmlp), Cstring, ())
lnmlp_query_support(backend, feature, supported) =
    ccall((:lnmlp_query_support, liblnmlp), Int32, (Int32, Int32, Ptr{Int32}), backend, feature, supported)
lnmlp_get_build_info(info) =
    ccall((:lnmlp_get_build_info, liblnmlp), Int32, (Ptr{Ptr{UInt8}},), info)

# ---- FP8 conversions ----
lnmlp_fp8_encode(format, input, count, scale, output) =
    ccall((:lnmlp_fp8_encode, liblnmlp), Int32, (Int32, Ptr{Float32}, Int64, Float32, Ptr{UInt8}),
          format, input, count, scale, output)
lnmlp_fp8_decode(format, input, count, scale_inv, output) =
    ccall((:lnmlp_fp8_decode, liblnmlp), Int32, (Int32, Ptr{UInt8}, Int64, Float32, Ptr{Float32}),
          format, input, count, scale_inv, output)

# ---- descriptor ----
lnmlp_desc_create(desc) = ccall((:lnmlp_desc_create, liblnmlp), Int32, (Ptr{Ptr{Cvoid}},), desc)
lnmlp_desc_destroy(desc) = ccall((:lnmlp_desc_destroy, liblnmlp), Int32, (Ptr{Cvoid},), desc)
lnmlp_desc_set_shape(desc, tokens, hidden, ffn) =
    ccall((:lnmlp_desc_set_shape, liblnmlp), Int32, (Ptr{Cvoid}, Int64, Int64, Int64), desc, tokens, hidden, ffn)
lnmlp_desc_set_norm(desc, norm_type) =
    ccall((:lnmlp_desc_set_norm, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, norm_type)
lnmlp_desc_set_zero_centered_gamma(desc, enabled) =
    ccall((:lnmlp_desc_set_zero_centered_gamma, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, enabled)
lnmlp_desc_set_epsilon(desc, epsilon) =
    ccall((:lnmlp_desc_set_epsilon, liblnmlp), Int32, (Ptr{Cvoid}, Float32), desc, epsilon)
lnmlp_desc_set_activations(desc, count, activations) =
    ccall((:lnmlp_desc_set_activations, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Ptr{Int32}), desc, count, activations)
lnmlp_desc_set_clamped_swiglu(desc, limit, alpha, offset) =
    ccall((:lnmlp_desc_set_clamped_swiglu, liblnmlp), Int32, (Ptr{Cvoid}, Float32, Float32, Float32),
          desc, limit, alpha, offset)
lnmlp_desc_set_bias(desc, has_bias1, has_bias2) =
    ccall((:lnmlp_desc_set_bias, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Int32), desc, has_bias1, has_bias2)
lnmlp_desc_set_dtype(desc, dtype) =
    ccall((:lnmlp_desc_set_dtype, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, dtype)
lnmlp_desc_set_remat(desc, policy) =
    ccall((:lnmlp_desc_set_remat, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, policy)
lnmlp_desc_set_backend(desc, backend, device) =
    ccall((:lnmlp_desc_set_backend, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Int32), desc, backend, device)
lnmlp_desc_set_num_threads(desc, num_threads) =
    ccall((:lnmlp_desc_set_num_threads, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, num_threads)
lnmlp_desc_set_weight_gradients(desc, accumulate, dtype) =
    ccall((:lnmlp_desc_set_weight_gradients, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Int32), desc, accumulate, dtype)
lnmlp_desc_set_recipe(desc, recipe) =
    ccall((:lnmlp_desc_set_recipe, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, recipe)
lnmlp_desc_set_fp8_format(desc, format) =
    ccall((:lnmlp_desc_set_fp8_format, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, format)
lnmlp_desc_set_delayed_scaling(desc, margin, amax_history_len, amax_compute_algo) =
    ccall((:lnmlp_desc_set_delayed_scaling, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Int32, Int32),
          desc, margin, amax_history_len, amax_compute_algo)
lnmlp_desc_set_scaling_options(desc, power_2_scale, amax_epsilon) =
    ccall((:lnmlp_desc_set_scaling_options, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Float32),
          desc, power_2_scale, amax_epsilon)
lnmlp_desc_set_sharding(desc, group_size, rank, sequence_parallel) =
    ccall((:lnmlp_desc_set_sharding, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Int32, Int32),
          desc, group_size, rank, sequence_parallel)
lnmlp_desc_set_communicator(desc, comm) =
    ccall((:lnmlp_desc_set_communicator, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Cvoid}), desc, comm)

# ---- communicators (the callback table mirrors the C struct lnmlp_comm_callbacks) ----
struct lnmlp_comm_callbacks
    size::Int32
    rank::Int32
    all_gather::Ptr{Cvoid}      # @cfunction pointers of lnmlp_comm_fn's signature
    reduce_scatter::Ptr{Cvoid}
    all_reduce_sum::Ptr{Cvoid}
    all_reduce_max::Ptr{Cvoid}
    user::Ptr{Cvoid}
end
lnmlp_comm_create_callbacks(table, comm) =
    ccall((:lnmlp_comm_create_callbacks, liblnmlp), Int32, (Ref{lnmlp_comm_callbacks}, Ptr{Ptr{Cvoid}}),
          table, comm)
lnmlp_comm_create_mpi(mpi_comm, comm) =
    ccall((:lnmlp_comm_create_mpi, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Ptr{Cvoid}}), mpi_comm, comm)
lnmlp_comm_create_nccl(nccl_comm, comm) =
    ccall((:lnmlp_comm_create_nccl, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Ptr{Cvoid}}), nccl_comm, comm)
lnmlp_comm_destroy(comm) = ccall((:lnmlp_comm_destroy, liblnmlp), Int32, (Ptr{Cvoid},), comm)

lnmlp_desc_set_external_workspace(desc, enabled) =
    ccall((:lnmlp_desc_set_external_workspace, liblnmlp), Int32, (Ptr{Cvoid}, Int32), desc, enabled)

# ---- plan ----
lnmlp_plan_create(desc, plan) =
    ccall((:lnmlp_plan_create, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Ptr{Cvoid}}), desc, plan)
lnmlp_plan_destroy(plan) = ccall((:lnmlp_plan_destroy, liblnmlp), Int32, (Ptr{Cvoid},), plan)
lnmlp_plan_get_workspace_bytes(plan, bytes) =
    ccall((:lnmlp_plan_get_workspace_bytes, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Int64}), plan, bytes)
lnmlp_plan_get_saved_bytes(plan, bytes) =
    ccall((:lnmlp_plan_get_saved_bytes, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Int64}), plan, bytes)
lnmlp_plan_get_saved_bytes_per_token(plan, bytes) =
    ccall((:lnmlp_plan_get_saved_bytes_per_token, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Int64}), plan, bytes)
lnmlp_plan_get_alignment(plan, bytes) =
    ccall((:lnmlp_plan_get_alignment, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Int64}), plan, bytes)
lnmlp_plan_attach_workspace(plan, workspace, bytes) =
    ccall((:lnmlp_plan_attach_workspace, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Int64), plan, workspace, bytes)
lnmlp_plan_get_tensor_shape(plan, tensor, tokens, rank, dims, dtype) =
    ccall((:lnmlp_plan_get_tensor_shape, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Int64, Ptr{Int32}, Ptr{Int64}, Ptr{Int32}),
          plan, tensor, tokens, rank, dims, dtype)

# ---- FP8 quantizer state ----
lnmlp_plan_attach_fp8_state(plan, state) =
    ccall((:lnmlp_plan_attach_fp8_state, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Cvoid}), plan, state)
lnmlp_plan_get_amax_history_length(plan, len) =
    ccall((:lnmlp_plan_get_amax_history_length, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Int32}), plan, len)
lnmlp_plan_get_quantizer_state(plan, quantizer, scale, amax_history, len) =
    ccall((:lnmlp_plan_get_quantizer_state, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Ptr{Float32}, Ptr{Float32}, Int32),
          plan, quantizer, scale, amax_history, len)
lnmlp_plan_set_quantizer_state(plan, quantizer, scale, amax_history, len) =
    ccall((:lnmlp_plan_set_quantizer_state, liblnmlp), Int32, (Ptr{Cvoid}, Int32, Float32, Ptr{Float32}, Int32),
          plan, quantizer, scale, amax_history, len)
lnmlp_plan_get_state_bytes(plan, bytes) =
    ccall((:lnmlp_plan_get_state_bytes, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Int64}), plan, bytes)
lnmlp_plan_export_state(plan, blob, bytes) =
    ccall((:lnmlp_plan_export_state, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Int64), plan, blob, bytes)
lnmlp_plan_import_state(plan, blob, bytes) =
    ccall((:lnmlp_plan_import_state, liblnmlp), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Int64), plan, blob, bytes)

# ---- execution (ABI 2: the call's tokens after the plan; fp8_state and flags before the stream) ----
lnmlp_plan_forward(plan, tokens, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state, flags, stream) =
    ccall((:lnmlp_plan_forward, liblnmlp), Int32,
          (Ptr{Cvoid}, Int64, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid},
           Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Int32, Ptr{Cvoid}),
          plan, tokens, x, gamma, beta, w1, b1, w2, b2, y, saved, fp8_state, flags, stream)
lnmlp_plan_backward(plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2,
                    fp8_state, flags, stream) =
    ccall((:lnmlp_plan_backward, liblnmlp), Int32,
          (Ptr{Cvoid}, Int64, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid},
           Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid},
           Ptr{Cvoid}, Ptr{Cvoid}, Int32, Ptr{Cvoid}),
          plan, tokens, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2,
          fp8_state, flags, stream)
