# Tests of LNMLP.jl against a Float64 reference written here.
# Run: LNMLP_LIBRARY=/path/to/liblnmlp.so.1 julia --project=bindings/julia/LNMLP -e 'using Pkg; Pkg.test()'
# NOTE: these tests have not been run yet (no Julia where the binding was written); the C signatures
# are checked by tools/check_julia_bindings.py instead.
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

    @testset "FP8" begin
        codes = fp8_encode(:e4m3, Float32[1, -2, 448, 1000], 1)
        @test fp8_decode(:e4m3, codes, 1) == Float32[1, -2, 448, 448]  # saturates
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

    @testset "BFloat16 conversions" begin
        @test Float32(BFloat16(1.5f0)) == 1.5f0
        @test Float32(BFloat16(1.00390625f0)) == 1.0f0  # a tie rounds to even
        @test isnan(BFloat16(NaN32))
    end
end
