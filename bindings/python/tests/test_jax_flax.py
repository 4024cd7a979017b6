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
from lnmlp.jax.flax import OVERWRITE_WITH_GRADIENT, LayerNormMLP  # noqa: E402

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
        if OVERWRITE_WITH_GRADIENT in variables:
            new[OVERWRITE_WITH_GRADIENT] = grads[OVERWRITE_WITH_GRADIENT]
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
        state = sharded[OVERWRITE_WITH_GRADIENT]["quantizer_state"]
        copies = [np.asarray(s.data) for s in state.addressable_shards]
        assert all(np.array_equal(c, copies[0]) for c in copies)
        # After a step the amaxes are of values computed from parameters and outputs that differ
        # by the sharded sums' bf16 roundings (dy = 2 (y - target) / n): 2 bf16 ulps (2^-7).
        np.testing.assert_allclose(copies[0], np.asarray(one[OVERWRITE_WITH_GRADIENT]["quantizer_state"]),
                                   rtol=2.0 ** -7)
    # No weight is gathered whole: the only all-gathers are of x's and dy's rows (sequence parallel).
    for line in hlo.splitlines():
        if " all-gather(" in line or " all-gather-start(" in line:
            assert f",{H}]" in line.split("all-gather")[0] and f"[{F}," not in line.split("all-gather")[0], line


def test_dropout_and_the_norm_output_are_refused_clearly():
    x, _ = _data(jnp.float32)
    for kw, match in ((dict(intermediate_dropout_rate=0.1), "dropout"),
                      (dict(return_layernorm_output=True), "norm output")):
        with pytest.raises(lnmlp.NotSupportedError, match=match):
            LayerNormMLP(intermediate_dim=F, **kw).init(jax.random.key(0), x)


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
