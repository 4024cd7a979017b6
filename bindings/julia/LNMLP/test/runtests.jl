# Tests of LNMLP.jl against a Float64 reference written here.
# Run: LNMLP_LIBRARY=/path/to/liblnmlp.so.2 julia --project=bindings/julia/LNMLP -e 'using Pkg; Pkg.test()'
# NOTE: these tests have not been run yet (no Julia where the binding was written). The raw
# declarations they reach (src/capi.jl, src/constants.jl) are generated from include/lnmlp.h by
# tools/gen_bindings.py, whose CTest (`gen_bindings.py --check`, label api) fails when they differ
# from the header; the hand-written layer on top (Plan, forward, backward, ...) is checked only here.
using LNMLP, Test, Random
using LNMLP: LNMLP_ERROR_INVALID_ARGUMENT, LNMLP_ERROR_INVALID_HANDLE, LNMLP_ERROR_NULL_POINTER

gelu(x) = 0.5x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715x^3)))
gelu_grad(x) = (u = sqrt(2 / pi) * (x + 0.044715x^3); t = tanh(u);
                0.5(1 + t) + 0.5x * (1 - t^2) * sqrt(2 / pi) * (1 + 3 * 0.044715x^2))

# Column-major shapes (the C shapes reversed): x (H, T), w1 (F, H) for A = 1, w2 (H, F).
function reference(x, gamma, beta, w1, b1, w2, b2, dy; eps=1e-6)
    x, dy = Float64.(x), Float64.(dy)
    H = size(x, 1)
    mu = sum(x; dims=1) / H
    var = sum((x .- mu) .^ 2; dims=1) / H
    rs = 1 ./ sqrt.(var .+ eps)
    xhat = (x .- mu) .* rs
    n = xhat .* gamma .+ beta
    h = w1 * n .+ b1
    a = gelu.(h)
    y = w2 * a .+ b2
    dh = (w2' * dy) .* gelu_grad.(h)
    dn = w1' * dh
    g = dn .* gamma
    dx = rs .* (g .- sum(g; dims=1) / H .- xhat .* sum(g .* xhat; dims=1) / H)
    return (; y, dx, dgamma=vec(sum(dn .* xhat; dims=2)), dbeta=vec(sum(dn; dims=2)), dw1=dh * n',
            db1=vec(sum(dh; dims=2)), dw2=dy * a', db2=vec(sum(dy; dims=2)))
end

relerr(got, want) = maximum(abs.(Float64.(got) .- want) ./ (1 .+ abs.(want)))
bits(a) = reinterpret(UInt32, vec(a))  # Float32 arrays compared bit for bit (NaN == NaN too)

# Runs f() and returns the exception it throws (nothing when it throws none).
thrown(f) = try f(); nothing catch err; err end

@testset "LNMLP.jl" begin
    T, H, F = 6, 16, 24
    rng = MersenneTwister(1)
    x = randn(rng, Float32, H, T); dy = randn(rng, Float32, H, T)
    gamma = 1 .+ 0.1f0 .* randn(rng, Float32, H); beta = 0.1f0 .* randn(rng, Float32, H)
    w1 = 0.3f0 .* randn(rng, Float32, F, H); b1 = 0.1f0 .* randn(rng, Float32, F)
    w2 = 0.3f0 .* randn(rng, Float32, H, F); b2 = 0.1f0 .* randn(rng, Float32, H)
    ref = reference(x, gamma, beta, w1, b1, w2, b2, dy)

    @testset "version and build" begin
        @test library_version()[4] == LNMLP.LNMLP_ABI_VERSION
        @test !isempty(build_info())
        @test query_support(:cpu, :backend)
        # experimental tier: the callback table starts with its own size (all fields 8 bytes)
        @test sizeof(LNMLP.lnmlp_comm_callbacks) == 64
        @test fieldnames(LNMLP.lnmlp_comm_callbacks)[1:3] == (:struct_size, :group_size, :rank)
    end

    for (Tp, tol) in ((Float32, 1e-4), (Float16, 3e-2), (BFloat16, 1e-1))
        @testset "forward/backward $Tp" begin
            c(a) = Tp.(a)
            plan = Plan(T, H, F; norm=:layernorm, activations=(:gelu,), use_bias1=true, use_bias2=true, dtype=Tp)
            y, saved = forward(plan, c(x), c(gamma), c(beta), c(w1), c(b1), c(w2), c(b2))
            @test eltype(y) == Tp && size(y) == (H, T)
            # the reference from the rounded inputs, so only the library's own error remains
            r = reference(Float32.(c(x)), Float32.(c(gamma)), Float32.(c(beta)), Float32.(c(w1)), Float32.(c(b1)),
                          Float32.(c(w2)), Float32.(c(b2)), Float32.(c(dy)))
            @test relerr(y, r.y) < tol
            g = backward(plan, c(dy), c(x), c(gamma), c(beta), c(w1), c(b1), c(w2), saved)
            @test relerr(g.dw2, r.dw2) < tol
            @test relerr(g.dw1, r.dw1) < tol
            @test relerr(g.dx, r.dx) < tol
            @test relerr(g.dgamma, r.dgamma) < tol && relerr(g.dbeta, r.dbeta) < tol
            @test relerr(vec(g.db1), r.db1) < tol && relerr(g.db2, r.db2) < tol
            close(plan)
            close(plan)  # idempotent
            @test !isopen(plan)
            e = try forward(plan, c(x), c(gamma), c(beta), c(w1), c(b1), c(w2), c(b2)); nothing catch err; err end
            @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_HANDLE
        end
    end

    @testset "each call's own tokens: t < max, t = 0, t > max" begin
        t = 4
        # One thread: a plan for T tokens and a plan for t tokens then sum in the same order, so a
        # call with t tokens must give the t-token plan's results bit for bit.
        kw = (norm=:layernorm, activations=(:gelu,), use_bias1=true, use_bias2=true, num_threads=1)
        big, small = Plan(T, H, F; kw...), Plan(t, H, F; kw...)
        @test big.max_tokens == T && small.max_tokens == t
        @test tensor_shape(big, :x) == (H, T) && tensor_shape(big, :x; tokens=t) == (H, t)
        @test tensor_shape(big, :y; tokens=0) == (H, 0)
        @test tensor_shape(big, :w1) == (F, 1, H) && tensor_shape(big, :b1) == (F, 1)
        @test tensor_shape(big, :w2) == (H, F) && tensor_shape(big, :dgamma) == (H,)
        @test tensor_shape(big, :fp8_state) === nothing  # recipe :none keeps no state
        @test tensor_shape(big, :saved)[1] == big.saved_bytes
        @test tensor_shape(big, :saved; tokens=t)[1] <= big.saved_bytes
        @test tensor_shape(Plan(T, H, F; norm=:rmsnorm), :beta) === nothing
        e = thrown(() -> tensor_shape(big, :x; tokens=T + 1))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT

        xt, dyt = x[:, 1:t], dy[:, 1:t]
        yb, sb = forward(big, xt, gamma, beta, w1, b1, w2, b2)
        ys, ss = forward(small, xt, gamma, beta, w1, b1, w2, b2)
        @test size(yb) == (H, t) && sb.nbytes == tensor_shape(big, :saved; tokens=t)[1]
        @test bits(yb) == bits(ys)
        @test relerr(yb, reference(xt, gamma, beta, w1, b1, w2, b2, dyt).y) < 1e-4
        gb = backward(big, dyt, xt, gamma, beta, w1, b1, w2, sb)
        gs = backward(small, dyt, xt, gamma, beta, w1, b1, w2, ss)
        @test size(gb.dx) == (H, t) && size(gb.dw1) == size(w1) && size(gb.db1) == (F, 1)
        for k in keys(gs)
            @test bits(gb[k]) == bits(gs[k])
        end
        # the tokens are all of x's trailing dims: (H, 2, 2) is 4 tokens
        y3, s3 = forward(big, reshape(xt, H, 2, 2), gamma, beta, w1, b1, w2, b2)
        @test size(y3) == (H, 2, 2) && bits(y3) == bits(ys)
        g3 = backward(big, reshape(dyt, H, 2, 2), reshape(xt, H, 2, 2), gamma, beta, w1, b1, w2, s3)
        @test size(g3.dx) == (H, 2, 2) && bits(g3.dx) == bits(gs.dx) && bits(g3.dw1) == bits(gs.dw1)
        # a saved buffer for fewer tokens than the call is refused before C sees it
        e = thrown(() -> backward(big, dy, x, gamma, beta, w1, b1, w2, sb))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("saved", e.message)

        # t = 0: forward reads and writes nothing; backward's parameter gradients are zeros
        x0 = zeros(Float32, H, 0)
        y0, s0 = forward(big, x0, gamma, beta, w1, b1, w2, b2)
        @test size(y0) == (H, 0)
        g0 = backward(big, zeros(Float32, H, 0), x0, gamma, beta, w1, b1, w2, s0)
        @test size(g0.dx) == (H, 0)
        @test all(k -> all(iszero, g0[k]), (:dgamma, :dbeta, :dw1, :db1, :dw2, :db2))
        g0 = backward(big, zeros(Float32, H, 0), x0, gamma, beta, w1, b1, w2, nothing)  # saved may be nothing
        @test all(iszero, g0.dw2)
        @test bits(forward(big, xt, gamma, beta, w1, b1, w2, b2)[1]) == bits(ys)  # unchanged by the empty calls

        # t > max: refused by the library, whose message names the plan's limit
        x7, dy7 = randn(rng, Float32, H, T + 1), randn(rng, Float32, H, T + 1)
        e = thrown(() -> forward(big, x7, gamma, beta, w1, b1, w2, b2))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT
        @test occursin("tokens must be in [0, $T]", e.message)
        _, sT = forward(big, x, gamma, beta, w1, b1, w2, b2)
        e = thrown(() -> backward(big, dy7, x7, gamma, beta, w1, b1, w2, sT))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT
        @test occursin("tokens must be in [0, $T]", e.message)
        # x's first dimension is hidden; anything else is refused by the binding
        e = thrown(() -> forward(big, randn(rng, Float32, H + 1, t), gamma, beta, w1, b1, w2, b2))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("x has size", e.message)
        close(big); close(small)
    end

    @testset "errors carry the library's message" begin
        e = try Plan(0, H, F); nothing catch err; err end
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && !isempty(e.message)
        plan = Plan(T, H, F; activations=:gelu)
        e = try forward(plan, x, gamma, beta, zeros(Float32, 3, 3), nothing, w2, nothing); nothing catch err; err end
        @test e isa LNMLPError && occursin("w1", e.message)
        e = try forward(plan, x, gamma, nothing, w1, nothing, w2, nothing); nothing catch err; err end
        @test e isa LNMLPError && e.status == LNMLP_ERROR_NULL_POINTER
        @test occursin("LNMLPError", sprint(showerror, e))
        plan = nothing; GC.gc()  # the finalizer frees the C plan
    end

    @testset "out-of-range integers are refused before ccall" begin
        # ccall's own conversion threw InexactError (Int64(2^64 + 8)), not LNMLPError; a Bool passed as 0 or 1
        i64 = "[$(typemin(Int64)), $(typemax(Int64))]"
        for (f, msg) in ((() -> Plan(big(2)^64 + 8, H, F), "tokens must be in $i64, got $(big(2)^64 + 8)"),
                         (() -> Plan(T, UInt64(2)^63, F), "hidden must be in $i64, got 9223372036854775808"),
                         (() -> Plan(T, H, -big(2)^63 - 1), "ffn must be in $i64"),
                         (() -> Plan(true, H, F), "tokens must be an integer, got true"),
                         (() -> Plan(T, H, F; num_threads=2^32), "num_threads must be in [0, 65536], got 4294967296"),
                         (() -> Plan(T, H, F; sharding=(big(2)^64 + 1, 0, false)), "sharding's group_size must be in $i64"),
                         (() -> Plan(T, H, F; sharding=(2, 2.0, false)), "sharding's rank must be an integer"),
                         (() -> Plan(T, H, F; recipe=:delayed, margin=2^31), "margin must be in"),
                         (() -> Plan(T, H, F; recipe=:delayed, amax_history_len=typemax(UInt64)), "amax_history_len must be in"),
                         (() -> Plan(T, H, F; recipe=:current, power_2_scale=-2^31 - 1), "power_2_scale must be in"))
            e = thrown(f)
            @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin(msg, e.message)
        end
        plan = Plan(T, H, F; num_threads=65536)  # the bound itself is the library's to take
        e = thrown(() -> tensor_shape(plan, :x; tokens=typemax(UInt64)))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("tokens must be in $i64", e.message)
        e = thrown(() -> new_grads(plan; tokens=big(2)^63))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("tokens must be in $i64", e.message)
        close(plan)
    end

    @testset "FP8" begin
        codes = fp8_encode(:e4m3, Float32[1, -2, 448, 1000], 1)
        @test fp8_decode(:e4m3, codes, 1) == Float32[1, -2, 448, 448]  # saturates
        @test fp8_encode(:e5m2, Float32[1, -2, 1e6], 1) == UInt8[0x3c, 0xc0, 0x7b]  # max 57344
        # the element types are LNMLP_DTYPE_FP8_* (4, 5); 0 and 1 (recipe formats) are refused
        src, dst = Float32[1], UInt8[0]
        @test LNMLP.lnmlp_fp8_encode(LNMLP.LNMLP_DTYPE_FP8_E4M3, src, 1, 1f0, dst) == LNMLP.LNMLP_SUCCESS
        @test dst[1] == 0x38
        @test LNMLP.lnmlp_fp8_encode(LNMLP.LNMLP_FP8_FORMAT_HYBRID, src, 1, 1f0, dst) == LNMLP_ERROR_INVALID_ARGUMENT
        plan = Plan(T, H, F; activations=:swiglu, recipe=:delayed, amax_history_len=4)
        w1g = 0.3f0 .* randn(rng, Float32, F, 2, H)
        y, saved = forward(plan, x, gamma, beta, w1g, nothing, w2, nothing)
        backward(plan, dy, x, gamma, beta, w1g, nothing, w2, saved)
        scale, hist = quantizer_state(plan, :ln_out)
        @test length(hist) == 4 && hist[1] > 0 && scale > 0
        blob = export_state(plan)
        set_quantizer_state!(plan, :w1, 2.0, zeros(Float32, 4))
        @test quantizer_state(plan, :w1)[1] == 2.0f0
        import_state!(plan, blob)
        @test export_state(plan) == blob
        close(plan)
    end

    @testset "FP8 state of the caller: per call, attached" begin
        HIST = 4
        plan = Plan(T, H, F; activations=:swiglu, recipe=:delayed, amax_history_len=HIST)
        w1g = 0.3f0 .* randn(rng, Float32, F, 2, H)
        @test tensor_shape(plan, :fp8_state) == (1 + HIST, 6)
        st = new_fp8_state(plan)
        @test size(st) == (1 + HIST, 6) && all(==(1f0), st[1, :]) && all(iszero, st[2:end, :])
        own = export_state(plan)
        y, saved = forward(plan, x, gamma, beta, w1g, nothing, w2, nothing; fp8_state=st)
        @test st[2, 1] > 0 && st[1, 1] != 1   # LN_OUT's amax recorded and its scale updated, in st
        @test all(iszero, st[2:end, 5:6])     # DY and DH are backward's
        @test export_state(plan) == own       # the plan's own state untouched
        backward(plan, dy, x, gamma, beta, w1g, nothing, w2, saved; fp8_state=st)
        @test st[2, 5] > 0 && st[2, 6] > 0
        @test export_state(plan) == own
        e = thrown(() -> forward(plan, x, gamma, beta, w1g, nothing, w2, nothing; fp8_state=zeros(Float32, HIST, 6)))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("fp8_state", e.message)
        # t = 0 leaves the state as it was
        before = copy(st)
        forward(plan, zeros(Float32, H, 0), gamma, beta, w1g, nothing, w2, nothing; fp8_state=st)
        @test st == before

        attach_fp8_state!(plan, st)           # now the plan's state is st
        @test quantizer_state(plan, :ln_out) == (st[1, 1], st[2:end, 1])
        set_quantizer_state!(plan, :w1, 2.0, zeros(Float32, HIST))
        @test st[1, 2] == 2f0 && all(iszero, st[2:end, 2])
        forward(plan, x, gamma, beta, w1g, nothing, w2, nothing)
        @test st[3, 1] == before[2, 1]        # the attached history moved down by one entry
        attach_fp8_state!(plan, nothing)      # back to the plan's own, which kept its values
        @test export_state(plan) == own
        close(plan)

        plain = Plan(T, H, F; activations=:gelu)
        e = thrown(() -> forward(plain, x, gamma, beta, w1, nothing, w2, nothing; fp8_state=zeros(Float32, 5, 6)))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin(":delayed", e.message)
        e = thrown(() -> attach_fp8_state!(plain, nothing))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT
        close(plain)
    end

    @testset "weights_unchanged: the plan's weight copies reused" begin
        @test LNMLP.LNMLP_CALL_DEFAULT == 0 && LNMLP.LNMLP_CALL_WEIGHTS_UNCHANGED == 1
        samebits(a, b) = a === nothing ? b === nothing : bits(a) == bits(b)
        Tc, Hc, Fc = 8, 32, 64
        xs = [randn(rng, Float32, Hc, Tc) for _ in 1:3]
        dys = [randn(rng, Float32, Hc, Tc) for _ in 1:3]
        gc = 1 .+ 0.1f0 .* randn(rng, Float32, Hc); bc = 0.1f0 .* randn(rng, Float32, Hc)
        w1c = 0.2f0 .* randn(rng, Float32, Fc, Hc); b1c = 0.1f0 .* randn(rng, Float32, Fc)
        w2c = 0.2f0 .* randn(rng, Float32, Hc, Fc); b2c = 0.1f0 .* randn(rng, Float32, Hc)
        kw = (activations=:gelu, use_bias1=true, use_bias2=true, recipe=:current, num_threads=1)

        # micro-batches with the same weights: flagged steps give the bits of unflagged ones
        plain, flagged = Plan(Tc, Hc, Fc; kw...), Plan(Tc, Hc, Fc; kw...)
        for k in 1:3
            y1, s1 = forward(plain, xs[k], gc, bc, w1c, b1c, w2c, b2c)
            y2, s2 = forward(flagged, xs[k], gc, bc, w1c, b1c, w2c, b2c; weights_unchanged=k > 1)
            @test bits(y1) == bits(y2)
            g1 = backward(plain, dys[k], xs[k], gc, bc, w1c, b1c, w2c, s1)
            g2 = backward(flagged, dys[k], xs[k], gc, bc, w1c, b1c, w2c, s2; weights_unchanged=true)
            @test all(key -> samebits(g1[key], g2[key]), keys(g1))
        end
        close(plain); close(flagged)

        # w1 halved behind the flag: the old (FP8-quantized) copy is used; without the flag the new w1
        p, ref = Plan(Tc, Hc, Fc; kw...), Plan(Tc, Hc, Fc; kw...)
        y0, s0 = forward(p, xs[1], gc, bc, w1c, b1c, w2c, b2c)
        g0 = backward(p, dys[1], xs[1], gc, bc, w1c, b1c, w2c, s0)
        half = w1c ./ 2
        ylie, slie = forward(p, xs[1], gc, bc, half, b1c, w2c, b2c; weights_unchanged=true)
        @test bits(ylie) == bits(y0)
        glie = backward(p, dys[1], xs[1], gc, bc, half, b1c, w2c, slie; weights_unchanged=true)
        @test all(key -> samebits(glie[key], g0[key]), keys(g0))
        yhalf, _ = forward(p, xs[1], gc, bc, half, b1c, w2c, b2c)
        yref, _ = forward(ref, xs[1], gc, bc, half, b1c, w2c, b2c)
        @test bits(yhalf) == bits(yref) && bits(yhalf) != bits(y0)
        yback, _ = forward(p, xs[1], gc, bc, w1c, b1c, w2c, b2c; weights_unchanged=true)
        @test bits(yback) == bits(yhalf)  # the copies kept are the halved w1's
        close(p); close(ref)

        # A plan without weight copies (Float32, recipe :none): the flag is harmless, even when the
        # arrays of the previous call have changed since (the weights are the arrays passed now,
        # with the same values; this caught a library that kept an f32 plan's weight addresses).
        p32 = Plan(Tc, Hc, Fc; activations=:gelu, num_threads=1)
        w1old, w2old = copy(w1c), copy(w2c)
        y0, s0 = forward(p32, xs[1], gc, bc, w1old, nothing, w2old, nothing)
        g0 = backward(p32, dys[1], xs[1], gc, bc, w1old, nothing, w2old, s0)
        fill!(w1old, NaN32); fill!(w2old, NaN32)
        y1, s1 = forward(p32, xs[1], gc, bc, w1c, nothing, w2c, nothing; weights_unchanged=true)
        g1 = backward(p32, dys[1], xs[1], gc, bc, w1c, nothing, w2c, s1; weights_unchanged=true)
        @test bits(y1) == bits(y0)
        @test all(key -> samebits(g1[key], g0[key]), keys(g0))
        close(p32)
    end

    @testset "gradient accumulation: backward!, new_grads, grad_dtype" begin
        Ta, Ha, Fa = 8, 16, 24
        ts = (8, 5, 3)  # the micro-batches' tokens
        xs = [randn(rng, Float32, Ha, t) for t in ts]
        dys = [randn(rng, Float32, Ha, t) for t in ts]
        ga = 1 .+ 0.1f0 .* randn(rng, Float32, Ha); ba = 0.1f0 .* randn(rng, Float32, Ha)
        w1a = 0.3f0 .* randn(rng, Float32, Fa, Ha); b1a = 0.1f0 .* randn(rng, Float32, Fa)
        w2a = 0.3f0 .* randn(rng, Float32, Ha, Fa); b2a = 0.1f0 .* randn(rng, Float32, Ha)
        init = (dw1=randn(rng, Float32, Fa, 1, Ha), db1=randn(rng, Float32, Fa, 1),
                dw2=randn(rng, Float32, Ha, Fa), db2=randn(rng, Float32, Ha))
        wkeys = (:dw1, :db1, :dw2, :db2)
        # init + the sum of the separate gradients, in Float64; the accumulated ones within 1e-6 of it
        want(parts, key) = Float64.(vec(init[key])) .+ sum(Float64.(vec(g[key])) for g in parts)
        near(got, w) = maximum(abs.(Float64.(vec(got)) .- w)) <= 1e-6 * maximum(abs.(w))

        # Float32: the separate gradients from a plan that overwrites
        kw = (activations=:gelu, use_bias1=true, use_bias2=true, num_threads=1)
        sep = Plan(Ta, Ha, Fa; kw...)
        acc = Plan(Ta, Ha, Fa; kw..., accumulate_grads=true)
        @test acc.accumulate_grads && !sep.accumulate_grads && acc.grad_dtype == Float32
        grads = new_grads(acc)
        @test size(grads.dx) == (Ha, Ta) && size(grads.dw1) == (Fa, 1, Ha) && size(grads.db1) == (Fa, 1)
        @test eltype(grads.dw1) == Float32 && all(iszero, grads.dw1)
        @test size(new_grads(acc; tokens=3).dx) == (Ha, 3)
        for key in wkeys
            grads[key] .= init[key]
        end
        parts = []
        for (k, t) in enumerate(ts)
            _, ss = forward(sep, xs[k], ga, ba, w1a, b1a, w2a, b2a)
            push!(parts, backward(sep, dys[k], xs[k], ga, ba, w1a, b1a, w2a, ss))
            _, sa = forward(acc, xs[k], ga, ba, w1a, b1a, w2a, b2a; weights_unchanged=k > 1)
            grads.dgamma .= NaN32
            g = merge(grads, (; dx=similar(xs[k])))  # this micro-batch's dx; the same weight gradients
            @test backward!(g, acc, dys[k], xs[k], ga, ba, w1a, b1a, w2a, sa; weights_unchanged=k > 1) === g
            # dx, dgamma, dbeta are overwritten
            @test bits(g.dx) == bits(parts[k].dx) && bits(grads.dgamma) == bits(parts[k].dgamma)
            @test bits(grads.dbeta) == bits(parts[k].dbeta)
        end
        for key in wkeys
            @test near(grads[key], want(parts, key))
        end
        # 0 tokens leave the accumulating gradients as they are
        w1before, b2before = copy(grads.dw1), copy(grads.db2)
        x0 = zeros(Float32, Ha, 0)
        backward!(merge(grads, (; dx=similar(x0))), acc, zeros(Float32, Ha, 0), x0, ga, ba, w1a, b1a, w2a, nothing)
        @test bits(grads.dw1) == bits(w1before) && bits(grads.db2) == bits(b2before) && all(iszero, grads.dgamma)
        # the allocating backward is refused; a gradient of the wrong element type too
        _, sa = forward(acc, xs[1], ga, ba, w1a, b1a, w2a, b2a)
        e = thrown(() -> backward(acc, dys[1], xs[1], ga, ba, w1a, b1a, w2a, sa))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("backward!", e.message)
        bad = merge(grads, (; dx=similar(xs[1]), dw2=zeros(Float16, Ha, Fa)))
        e = thrown(() -> backward!(bad, acc, dys[1], xs[1], ga, ba, w1a, b1a, w2a, sa))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("dw2 has element type", e.message)
        bad = merge(grads, (; dx=similar(xs[1]), dgamma=grads.dbeta))
        e = thrown(() -> backward!(bad, acc, dys[1], xs[1], ga, ba, w1a, b1a, w2a, sa))
        @test e isa LNMLPError && occursin("share one array", e.message)
        close(sep); close(acc)

        # BFloat16 I/O, Float32 weight gradients ("main grads")
        bf(a) = BFloat16.(a)
        kwb = merge(kw, (dtype=BFloat16, grad_dtype=Float32))
        sepb = Plan(Ta, Ha, Fa; kwb...)
        accb = Plan(Ta, Ha, Fa; kwb..., accumulate_grads=true)
        @test accb.dtype == BFloat16 && accb.grad_dtype == Float32 && sepb.grad_dtype == Float32
        gb = new_grads(accb)
        @test eltype(gb.dw1) == Float32 && eltype(gb.db2) == Float32
        @test eltype(gb.dx) == BFloat16 && eltype(gb.dgamma) == BFloat16
        for key in wkeys
            gb[key] .= init[key]
        end
        partsb = []
        for (k, t) in enumerate(ts)
            xb, dyb = bf(xs[k]), bf(dys[k])
            _, ss = forward(sepb, xb, bf(ga), bf(ba), bf(w1a), bf(b1a), bf(w2a), bf(b2a))
            push!(partsb, backward(sepb, dyb, xb, bf(ga), bf(ba), bf(w1a), bf(b1a), bf(w2a), ss))
            _, sa = forward(accb, xb, bf(ga), bf(ba), bf(w1a), bf(b1a), bf(w2a), bf(b2a); weights_unchanged=k > 1)
            backward!(merge(gb, (; dx=similar(xb))), accb, dyb, xb, bf(ga), bf(ba), bf(w1a), bf(b1a), bf(w2a), sa;
                      weights_unchanged=true)
        end
        @test eltype(partsb[1].dw1) == Float32  # the allocating backward gives main grads too
        for key in wkeys
            @test near(gb[key], want(partsb, key))
        end
        # a gradient array whose element type does not fit the plan's gradient dtype is refused
        xb = bf(xs[1])
        _, sa = forward(accb, xb, bf(ga), bf(ba), bf(w1a), bf(b1a), bf(w2a), bf(b2a))
        bad = merge(gb, (; dx=similar(xb), dw1=zeros(BFloat16, Fa, 1, Ha)))
        e = thrown(() -> backward!(bad, accb, bf(dys[1]), xb, bf(ga), bf(ba), bf(w1a), bf(b1a), bf(w2a), sa))
        @test e isa LNMLPError && occursin("dw1 has element type", e.message) && occursin("Float32", e.message)
        close(sepb); close(accb)
        p16 = Plan(Ta, Ha, Fa; activations=:gelu, dtype=BFloat16, accumulate_grads=true)
        @test p16.grad_dtype == BFloat16 && eltype(new_grads(p16).dw1) == BFloat16
        _, s16 = forward(p16, xb, bf(ga), bf(ba), bf(w1a), nothing, bf(w2a), nothing)
        bad = merge(new_grads(p16; tokens=ts[1]), (; dw1=zeros(Float32, Fa, 1, Ha)))
        e = thrown(() -> backward!(bad, p16, bf(dys[1]), xb, bf(ga), bf(ba), bf(w1a), nothing, bf(w2a), s16))
        @test e isa LNMLPError && occursin("dw1 has element type Float32", e.message)
        close(p16)
        # the library refuses a gradient dtype other than the plan's and Float32; the binding non-types
        e = thrown(() -> Plan(Ta, Ha, Fa; dtype=BFloat16, grad_dtype=Float16))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT
        e = thrown(() -> Plan(Ta, Ha, Fa; grad_dtype=Int32))
        @test e isa LNMLPError && e.status == LNMLP_ERROR_INVALID_ARGUMENT && occursin("grad_dtype", e.message)
    end

    @testset "BFloat16 conversions" begin
        @test Float32(BFloat16(1.5f0)) == 1.5f0
        @test Float32(BFloat16(1.00390625f0)) == 1.0f0  # a tie rounds to even
        @test isnan(BFloat16(NaN32))
    end
end
