"""lnmlp.jax.flax.LayerNormMLP: TransformerEngine's parameter names, shapes, initialisation and
logical axes, and jitted training steps on a 2x2 CPU mesh (flax's logical axis rules) that equal
the same steps on one device, FP8 delayed-scaling state included."""

import os

import numpy as np
import pytest

import _reference as ref

if os.environ.get("LNMLP_REQUIRE_JAX") == "1":  # the README's test command: never skip silently
    import jax
    import flax.linen as nn
else:
    jax = pytest.importorskip("jax")
    nn = pytest.importorskip("flax.linen")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import lnmlp  # noqa: E402
import lnmlp.jax as lj  # noqa: E402
from lnmlp.jax.flax import FP8_COLLECTION, LayerNormMLP  # noqa: E402

B, S, H, F = 4, 16, 64, 128
RULES = (("batch", "data"), ("seq", None), ("embed", None), ("act", None), ("mlp", "tensor"))


def _model(dtype=jnp.float32, recipe=None, sp=False):
    return LayerNormMLP(intermediate_dim=F, activations=("silu", "linear"), use_bias=True, dtype=dtype,
                        layernorm_input_axes=("batch", "mlp" if sp else "seq", "embed"), fp8_recipe=recipe)


def _data(dtype):
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((B, S, H)), dtype)
    return x, jnp.asarray(np.sin(np.asarray(x, np.float32) * 2), dtype)


def _train(model, variables, x, target, steps=2):
    """`steps` jitted SGD steps; the FP8 collection is overwritten with its gradient."""

    @jax.jit
    def step(variables, x, target):
        def loss(v):
            y, _ = model.apply(v, x)
            return jnp.mean((y.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)

        value, grads = jax.value_and_grad(loss)(variables)
        new = {"params": jax.tree.map(lambda p, g: p - 0.1 * g, variables["params"], grads["params"])}
        if FP8_COLLECTION in variables:
            new[FP8_COLLECTION] = grads[FP8_COLLECTION]
        return new, value

    losses = []
    for _ in range(steps):
        variables, value = step(variables, x, target)
        losses.append(float(value))
    return variables, losses, step.lower(variables, x, target).compile().as_text()


def test_parameters_are_named_shaped_and_initialised_as_transformer_engine_does():
    x, _ = _data(jnp.float32)
    boxed = _model().init(jax.random.key(0), x)
    specs = nn.get_partition_spec(boxed)["params"]
    params = nn.unbox(boxed)["params"]
    want = {"scale": ((H,), ("embed",)), "ln_bias": ((H,), ("embed",)),
            "wi_kernel": ((H, 2, F), ("embed", "act", "mlp")),
            "wi_bias": ((2, F), ("act", "mlp")), "wo_kernel": ((F, H), ("mlp", "embed")), "wo_bias": ((H,), ("embed",))}
    assert set(params) == set(want)
    for name, (shape, axes) in want.items():
        assert params[name].shape == shape and tuple(specs[name]) == axes, name
    np.testing.assert_array_equal(params["scale"], 1)
    for name in ("ln_bias", "wi_bias", "wo_bias"):
        np.testing.assert_array_equal(params[name], 0)
    # variance_scaling(1, fan_in, truncated normal): std 1/sqrt(fan in), for each activation's kernel.
    for k, fan_in in ((params["wi_kernel"][:, 0], H), (params["wi_kernel"][:, 1], H), (params["wo_kernel"], F)):
        assert abs(float(jnp.std(k)) * np.sqrt(fan_in) - 1) < 0.1
    assert not np.allclose(params["wi_kernel"][:, 0], params["wi_kernel"][:, 1])
    zc = LayerNormMLP(intermediate_dim=F, zero_centered_gamma=True).init(jax.random.key(0), x)
    np.testing.assert_array_equal(nn.unbox(zc)["params"]["scale"], 0)


@pytest.mark.parametrize("kind", ["float32", "float32-sp", "bfloat16-delayed"])
def test_training_steps_on_a_mesh_equal_one_device(kind):
    dtype = jnp.bfloat16 if kind.startswith("bfloat16") else jnp.float32
    recipe = lj.DelayedScaling(amax_history_len=4) if kind.endswith("delayed") else None
    model = _model(dtype, recipe, sp=kind.endswith("sp"))
    x, target = _data(dtype)
    boxed = model.init(jax.random.key(1), x)
    one, one_losses, _ = _train(model, nn.unbox(boxed), x, target)

    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, RULES)
    variables = jax.device_put(nn.unbox(boxed), shardings)
    assert variables["params"]["wi_kernel"].sharding.spec == P(None, None, "tensor")
    x_spec = P("data", "tensor" if kind.endswith("sp") else None, None)
    placed = [jax.device_put(a, jax.sharding.NamedSharding(mesh, x_spec)) for a in (x, target)]
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        sharded, losses, hlo = _train(model, variables, *placed)

    tol = ref.TOLERANCE_FP8_SHARDED if recipe is not None else ref.TOLERANCES[jnp.dtype(dtype).name]
    np.testing.assert_allclose(losses, one_losses, rtol=tol)
    for name, p in sharded["params"].items():
        want = np.asarray(one["params"][name], np.float64)
        err = np.max(np.abs(np.asarray(p, np.float64) - want)) / np.max(np.abs(want))
        assert err <= tol, f"{name}: {err:.2e}"
    assert tuple(sharded["params"]["wo_kernel"].sharding.spec)[:1] == ("tensor",)
    if recipe is not None:
        for name, state in sharded[FP8_COLLECTION].items():
            copies = [np.asarray(s.data) for s in state.addressable_shards]
            assert all(np.array_equal(c, copies[0]) for c in copies), name
            # After a step the amaxes are of values computed from parameters and outputs that differ
            # by the sharded sums' bf16 roundings (dy = 2 (y - target) / n): 2 bf16 ulps (2^-7).
            np.testing.assert_allclose(copies[0], np.asarray(one[FP8_COLLECTION][name]), rtol=2.0 ** -7, err_msg=name)
    # No weight is gathered whole: the only all-gathers are of x's and dy's rows (sequence parallel).
    for line in hlo.splitlines():
        if " all-gather(" in line or " all-gather-start(" in line:
            assert f",{H}]" in line.split("all-gather")[0] and f"[{F}," not in line.split("all-gather")[0], line


def test_the_remaining_attributes_keep_transformer_engines_meaning_or_are_refused_by_name():
    x, _ = _data(jnp.float32)
    base = dict(intermediate_dim=F, activations=("gelu",))
    variables = LayerNormMLP(**base).init(jax.random.key(0), x)
    y, _ = LayerNormMLP(**base).apply(variables, x)
    # Dropout at a rate > 0 is the identity with deterministic=True (TE's meaning), so the block runs,
    # its rng collection and mask dimensions with it; with deterministic=False it is refused.
    dropout = LayerNormMLP(**base, intermediate_dropout_rate=0.1, intermediate_dropout_rng_name="my_rng",
                           intermediate_hidden_dropout_dims=(-2,))
    np.testing.assert_array_equal(np.asarray(dropout.apply(variables, x, deterministic=True)[0]), np.asarray(y))
    with pytest.raises(lnmlp.NotSupportedError, match="intermediate_dropout_rate=0.1 with deterministic=False"):
        dropout.apply(variables, x, deterministic=False)
    for kw, error, match in ((dict(enable_layernorm=False), lnmlp.NotSupportedError, "enable_layernorm=False"),
                             (dict(enable_low_rank_adaptation=True), lnmlp.NotSupportedError,
                              "enable_low_rank_adaptation=True"),
                             (dict(intermediate_dropout_rate=1.5), lnmlp.InvalidArgumentError,
                              "intermediate_dropout_rate must be in")):
        with pytest.raises(error, match=match):
            LayerNormMLP(**base, **kw).init(jax.random.key(0), x)


def test_quantization_checkpoint_name_names_the_saved_quantized_operands():
    """Under FP8 the saved residual holds the quantized operands, so a jax.checkpoint policy that saves
    quantization_checkpoint_name keeps it, as one that saves ffn1_ckpt_name does, with the same
    gradients; a policy that saves neither keeps no residual of the block."""
    import contextlib
    import io

    x, _ = _data(jnp.bfloat16)
    model = LayerNormMLP(intermediate_dim=F, dtype=jnp.bfloat16, fp8_recipe=lj.Float8BlockScaling(),
                         quantization_checkpoint_name="my_quantized")
    variables = nn.unbox(model.init(jax.random.key(0), x))

    def loss(v, x):
        return jnp.sum(model.apply(v, x)[0].astype(jnp.float32) ** 2)

    def kept(policy):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(jax.checkpoint(loss, policy=policy), variables, x)
        return [line for line in out.getvalue().splitlines() if "named '" in line]

    names = jax.checkpoint_policies.save_only_these_names
    assert any("named 'my_quantized'" in line for line in kept(names("my_quantized"))), kept(names("my_quantized"))
    assert any("named 'ffn1'" in line for line in kept(names("ffn1")))
    assert kept(jax.checkpoint_policies.nothing_saveable) == []
    want = jax.grad(loss)(variables, x)
    for policy in (names("my_quantized"), jax.checkpoint_policies.nothing_saveable):
        got = jax.jit(jax.grad(jax.checkpoint(loss, policy=policy)))(variables, x)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


# TransformerEngine's Flax LayerNormMLP attributes and defaults (TE main d0067d0, 2.20.0.dev0,
# transformer_engine/jax/flax/module.py lines 997-1030; kernel_init None and scale_init None are
# resolved in its __post_init__ to what the test below checks).
TE_DEFAULTS = dict(
    intermediate_dim=2048, enable_layernorm=True, layernorm_type="layernorm", epsilon=1e-6,
    zero_centered_gamma=False, scale_init=None, scale_axes=("embed",), ln_bias_init=nn.initializers.zeros,
    ln_bias_axes=("embed",), kernel_init=None, kernel_axes_1=("embed", "act", "mlp"), kernel_axes_2=("mlp", "embed"),
    use_bias=False, bias_init=nn.initializers.zeros, bias_axes_1=("act", "mlp"), bias_axes_2=("embed",),
    return_layernorm_output=False, activations=("gelu",), activation_params=None,
    intermediate_dropout_rng_name="dropout", intermediate_dropout_rate=0.0, intermediate_hidden_dropout_dims=(),
    enable_low_rank_adaptation=False, low_rank_adaptation_dim=32, low_rank_adaptation_alpha=None, axis=-1,
    dtype=jnp.float32, layernorm_input_axes=None, dot_1_input_axes=None, dot_2_input_axes=None,
    ffn1_ckpt_name="ffn1", ffn2_ckpt_name="ffn2", transpose_batch_sequence=False, quantization_checkpoint_name=None)


def test_the_default_constructor_builds_transformer_engines_model():
    import dataclasses
    fields = {f.name: f.default for f in dataclasses.fields(LayerNormMLP) if f.name not in ("parent", "name")}
    # Every attribute of TE's, in TE's order (positional construction means the same), then
    # lnmlp's own fp8_recipe (TE reads its recipe from the autocast context, which lnmlp's honours too).
    assert list(fields) == list(TE_DEFAULTS) + ["fp8_recipe"]
    for name, default in TE_DEFAULTS.items():
        assert fields[name] == default, f"{name}: {fields[name]!r}, TransformerEngine's is {default!r}"
    # The model the default constructor builds: names, shapes, axes, initialisation and outputs.
    x, _ = _data(jnp.float32)
    boxed = LayerNormMLP().init(jax.random.key(3), x)
    specs, params = nn.get_partition_spec(boxed)["params"], nn.unbox(boxed)["params"]
    want = {"scale": ((H,), ("embed",)), "ln_bias": ((H,), ("embed",)),
            "wi_kernel": ((H, 1, 2048), ("embed", "act", "mlp")), "wo_kernel": ((2048, H), ("mlp", "embed"))}
    assert {n: (p.shape, tuple(specs[n])) for n, p in params.items()} == want
    assert all(p.dtype == jnp.float32 for p in params.values())
    np.testing.assert_array_equal(params["scale"], 1)
    np.testing.assert_array_equal(params["ln_bias"], 0)
    for k, fan_in in ((params["wi_kernel"][:, 0], H), (params["wo_kernel"], 2048)):
        assert abs(float(jnp.std(k)) * np.sqrt(fan_in) - 1) < 0.05
    out, ln = LayerNormMLP().apply(boxed, x)
    assert ln is None
    p = {n: np.asarray(v) for n, v in params.items()}
    y, _ = ref.forward(np.asarray(x).reshape(-1, H), p["scale"], p["ln_bias"], p["wi_kernel"], None, p["wo_kernel"],
                       None, "layernorm", False, 1e-6, ("gelu",), {})
    ref.assert_close("flax default out", np.asarray(out).reshape(-1, H), y, "float32")


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "float16-rmsnorm-zc", "bfloat16-delayed", "bfloat16-block",
                                  "bfloat16-mesh-sp"])
def test_return_layernorm_output_gives_the_norm_output_and_its_gradient(kind):
    """(out, ln_output) as TransformerEngine returns them: ln_output the norm in the inputs' dtype;
    a loss reading both differentiates through both (against the float64 block with the norm
    output's cotangent joining GEMM1's); out as without the norm output, bit for bit."""
    dtype = {"float32": jnp.float32, "float16": jnp.float16}.get(kind.split("-")[0], jnp.bfloat16)
    recipe = {"delayed": lj.DelayedScaling(amax_history_len=4), "block": lj.Float8BlockScaling()}.get(
        kind.split("-")[-1])
    norm, zc = ("rmsnorm", True) if "rmsnorm" in kind else ("layernorm", False)
    kw = dict(intermediate_dim=F, activations=("silu", "linear"), use_bias=True, dtype=dtype, layernorm_type=norm,
              zero_centered_gamma=zc, fp8_recipe=recipe)
    sp = kind.endswith("mesh-sp")
    if sp:
        kw["layernorm_input_axes"] = ("batch", "mlp", "embed")
    model, plain = LayerNormMLP(return_layernorm_output=True, **kw), LayerNormMLP(**kw)
    x, _ = _data(dtype)
    variables = nn.unbox(plain.init(jax.random.key(5), x))
    rng = np.random.default_rng(9)
    dy, dln = (jnp.asarray(rng.standard_normal(x.shape), dtype) for _ in range(2))

    def loss(variables, x):
        out, ln = model.apply(variables, x)
        return jnp.sum(out.astype(jnp.float32) * dy) + jnp.sum(ln.astype(jnp.float32) * dln), (out, ln)

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    if sp:
        mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        x_spec = jax.sharding.NamedSharding(mesh, P("data", "tensor", None))
        with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
            (_, (out, ln)), (grads, dx) = run(variables, jax.device_put(x, x_spec))
            out_plain = jax.jit(plain.apply)(variables, jax.device_put(x, x_spec))[0]
        assert tuple(ln.sharding.spec)[:2] == ("data", "tensor")  # sharded as x
    else:
        (_, (out, ln)), (grads, dx) = run(variables, x)
        out_plain = plain.apply(variables, x)[0]
    assert ln.shape == x.shape and ln.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out_plain, np.float32))

    p = variables["params"]
    p = {n: np.asarray(v) for n, v in p.items()}
    args = (np.asarray(x, np.float64).reshape(-1, H), p["scale"], p.get("ln_bias"), p["wi_kernel"], p["wi_bias"],
            p["wo_kernel"], p["wo_bias"], norm, zc, 1e-6, ("silu", "linear"), {})
    _, parts = ref.forward(*args)
    name = jnp.dtype(dtype).name
    ref.assert_close(f"ln_output {kind}", np.asarray(ln, np.float64).reshape(-1, H), parts["n"], name)
    want = ref.backward(np.asarray(dy, np.float64).reshape(-1, H), *args, dn_extra=np.asarray(dln, np.float64)
                        .reshape(-1, H))
    g = grads["params"]
    if recipe is not None:  # FP8 GEMMs: their own error bound, on the gradients through the block
        checks = [("dx", dx, want["dx"]), ("dgamma", g["scale"], want["dgamma"])]
        for label, got, exact in checks:
            err = np.max(np.abs(np.asarray(got, np.float64).reshape(exact.shape) - exact)) / np.max(np.abs(exact))
            assert err < 0.15, f"{label}: {err:.3f}"
        return
    for label, got, exact in (("dx", dx, want["dx"]), ("dgamma", g["scale"], want["dgamma"]),
                              ("dbeta", g.get("ln_bias"), want["dbeta"]), ("dwi", g["wi_kernel"], want["dw1"])):
        if exact is not None:
            ref.assert_close(f"{label} {kind}", np.asarray(got, np.float64).reshape(exact.shape), exact, name)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_the_mesh_example_trains_as_one_device(sp):
    """examples/jax/mesh.py, the set-up docs/jax-mesh.md shows, on a 2x4 mesh."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "jax", "mesh.py")
    spec = importlib.util.spec_from_file_location("lnmlp_mesh_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    losses, one_losses, diff, collectives = example.main(2, 4, sp, steps=3, batch=4, seq=16, hidden=64, ffn=128)
    np.testing.assert_allclose(losses, one_losses, rtol=ref.TOLERANCES["float32"])
    assert diff <= ref.TOLERANCES["float32"]
    assert "all-gather" in collectives if sp else set(collectives) == {"all-reduce"}, collectives


def _fp8_model(L=4):
    return LayerNormMLP(intermediate_dim=F, activations=("gelu", "linear"), use_bias=True, dtype=jnp.bfloat16,
                        fp8_recipe=lj.DelayedScaling(amax_history_len=L))


def test_the_fp8_state_is_kept_in_transformer_engines_collection_names_and_shapes():
    x, target = _data(jnp.bfloat16)
    model = _fp8_model()
    variables = nn.unbox(model.init(jax.random.key(2), x))
    metas = variables[FP8_COLLECTION]
    assert set(metas) == {f"{n}{s}" for n in ("x_0", "kernel_0", "grad_0", "x_1", "kernel_1", "grad_1")
                          for s in ("_scale", "_amax_history")}
    assert all(v.dtype == jnp.float32 and v.shape == ((1,) if k.endswith("_scale") else (4,)) for k, v in metas.items())
    # A TransformerEngine checkpoint's values: each variable reaches the quantizer of its name. The
    # function with one set whose rows are those variables (ln_out x_0, w1 kernel_0, act_out x_1,
    # w2 kernel_1, dy grad_1, dh grad_0) gives the same output and the same state after the step.
    rng = np.random.default_rng(4)
    te = {k: jnp.asarray(rng.uniform(0.5, 4.0, v.shape), jnp.float32) for k, v in metas.items()}
    ckpt = dict(variables, **{FP8_COLLECTION: te})
    rows = jnp.stack([jnp.concatenate([te[f"{n}_scale"], te[f"{n}_amax_history"]])
                      for n in ("x_0", "kernel_0", "x_1", "kernel_1", "grad_1", "grad_0")])
    p = ckpt["params"]

    def module_loss(fp8, x):
        y, _ = model.apply(dict(ckpt, **{FP8_COLLECTION: fp8}), x)
        return jnp.sum(y.astype(jnp.float32) * target.astype(jnp.float32))

    def function_loss(state, x):
        qs = lj.QuantizerSet(lj.DelayedScaling(amax_history_len=4), state)
        y = lj.layernorm_mlp(x, p["scale"], p["ln_bias"], [p["wi_kernel"], p["wo_kernel"]],
                             [p["wi_bias"], p["wo_bias"]], "layernorm", activation_type=("gelu", "linear"),
                             quantizer_set=qs)
        return jnp.sum(y.astype(jnp.float32) * target.astype(jnp.float32))

    (loss, new), (loss_fn, new_fn) = (jax.jit(jax.value_and_grad(f))(a, x) for f, a in
                                      ((module_loss, te), (function_loss, rows)))
    assert float(loss) == float(loss_fn)
    for i, n in enumerate(("x_0", "kernel_0", "x_1", "kernel_1", "grad_1", "grad_0")):
        np.testing.assert_array_equal(np.asarray(new[f"{n}_scale"]), np.asarray(new_fn[i, :1]), err_msg=n)
        np.testing.assert_array_equal(np.asarray(new[f"{n}_amax_history"]), np.asarray(new_fn[i, 1:]),
                                      err_msg=n)
    assert not np.array_equal(np.asarray(new["grad_0_amax_history"]), np.asarray(te["grad_0_amax_history"]))
    # A checkpoint whose histories are of another length than the recipe's is refused by name.
    with pytest.raises(lnmlp.InvalidArgumentError, match="fp8_metas/x_0_amax_history is float32 \\(16,\\)"):
        model.apply(dict(ckpt, **{FP8_COLLECTION: dict(te, x_0_amax_history=jnp.zeros((16,), jnp.float32))}), x)


def test_variables_in_the_earlier_layout_load_after_migrate_fp8_state():
    from lnmlp.jax.flax import OVERWRITE_WITH_GRADIENT, TE_FP8_NAMES, migrate_fp8_state
    x, _ = _data(jnp.bfloat16)
    model = _fp8_model()
    variables = nn.unbox(model.init(jax.random.key(2), x))
    state = np.random.default_rng(5).uniform(0.5, 4.0, (6, 5)).astype(np.float32)
    old = {"params": variables["params"], OVERWRITE_WITH_GRADIENT: {"quantizer_state": jnp.asarray(state)}}
    migrated = migrate_fp8_state(old)
    assert OVERWRITE_WITH_GRADIENT not in migrated
    for i, n in enumerate(TE_FP8_NAMES):
        np.testing.assert_array_equal(np.asarray(migrated[FP8_COLLECTION][f"{n}_scale"]), state[i, :1])
        np.testing.assert_array_equal(np.asarray(migrated[FP8_COLLECTION][f"{n}_amax_history"]), state[i, 1:])
    y, _ = model.apply(migrated, x)
    p = variables["params"]
    want = lj.layernorm_mlp(x, p["scale"], p["ln_bias"], [p["wi_kernel"], p["wo_kernel"]], [p["wi_bias"], p["wo_bias"]],
                            "layernorm", activation_type=("gelu", "linear"),
                            quantizer_set=lj.QuantizerSet(lj.DelayedScaling(amax_history_len=4), jnp.asarray(state)))
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(want, np.float32))
    assert migrate_fp8_state(migrated) == migrated  # nothing to migrate: unchanged
