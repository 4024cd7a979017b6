"""lnmlp.jax.autocast (and fp8_autocast) and MeshResource, as TransformerEngine's: the Flax module
takes the context's recipe when it has none of its own; TransformerEngine's logical axis names map
onto the mesh through the MeshResource, in the axes arguments and in flax's rules
(extend_logical_axis_rules), splitting the block as the mesh axes' names do."""

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

import lnmlp  # noqa: E402
import lnmlp.jax as lj  # noqa: E402
from _block_cases import make  # noqa: E402
from lnmlp.jax import _sharding  # noqa: E402
from lnmlp.jax.flax import FP8_COLLECTION, LayerNormMLP, extend_logical_axis_rules  # noqa: E402

B, S, H, F = 4, 8, 32, 64


def _x(dtype=jnp.bfloat16):
    return jnp.asarray(np.random.default_rng(3).standard_normal((B, S, H)), dtype)


@pytest.mark.parametrize("context", ["autocast", "fp8_autocast", "autocast-default-recipe"])
def test_the_flax_module_takes_the_contexts_recipe(context):
    recipe = lj.DelayedScaling(amax_history_len=4)
    x = _x()
    model = LayerNormMLP(intermediate_dim=F, dtype=jnp.bfloat16)
    if context == "fp8_autocast":
        ctx = lj.fp8_autocast(enabled=True, fp8_recipe=recipe)
    else:
        ctx = lj.autocast(enabled=True, recipe=None if context.endswith("default-recipe") else recipe)
        recipe = lj.DelayedScaling() if context.endswith("default-recipe") else recipe
    with ctx:
        variables = model.init(jax.random.key(0), x)
        out, _ = model.apply(variables, x)
    own = LayerNormMLP(intermediate_dim=F, dtype=jnp.bfloat16, fp8_recipe=recipe)
    want_vars = own.init(jax.random.key(0), x)
    want, _ = own.apply(want_vars, x)
    assert variables[FP8_COLLECTION]["x_0_amax_history"].shape == (recipe.amax_history_len,)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))
    # Outside the context, or with enabled=False, the module runs unquantized.
    plain = LayerNormMLP(intermediate_dim=F, dtype=jnp.bfloat16)
    with lj.autocast(enabled=False, recipe=recipe):
        off = plain.init(jax.random.key(0), x)
    assert FP8_COLLECTION not in off
    assert not np.array_equal(np.asarray(plain.apply(off, x)[0], np.float32), np.asarray(out, np.float32))
    assert lj._autocast.global_recipe() is None  # the context is left as it was


MESH_NAMES = {  # TransformerEngine's logical names -> the mesh axes they name under the resource below
    "dp": (("nvte_batch", "nvte_seqlen", "nvte_hidden"), ("data", None, None)),
    "sp": (("nvte_batch", "nvte_seqlen_tp", "nvte_hidden"), ("data", "tensor", None)),
}


@pytest.mark.parametrize("kind", ["dp", "sp"])
def test_transformer_engines_logical_axes_split_as_the_mesh_axes_do(kind):
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    resource = lj.MeshResource(dp_resource="data", tp_resource="tensor" if kind == "dp" else None,
                               tpsp_resource="tensor" if kind == "sp" else None)
    te_x, mesh_x = MESH_NAMES[kind]
    te_k1, mesh_k1 = ("nvte_w_fsdp", "nvte_w_joined", "nvte_w_tp"), (None, None, "tensor")
    te_k2, mesh_k2 = ("nvte_w_tp", "nvte_w_fsdp"), ("tensor", None)
    d = make(1, np.float32, lead=(B, S), seed=6, H=H, F=F)
    args = (jnp.asarray(d["x"]), d["gamma"], d["beta"], [d["k1"], d["k2"]], [d["b1"], d["b2"]], "layernorm")

    def run(x_axes, k1_axes, k2_axes):
        f = jax.jit(lambda x: lj.layernorm_mlp(x, *args[1:], norm_input_axes=x_axes, kernel_1_axes=k1_axes,
                                               kernel_2_axes=k2_axes, activation_type=("gelu",)))
        layout = _sharding.resolve_layout(args[0], jnp.asarray(d["k1"]), jnp.asarray(d["k2"]), None, x_axes,
                                          k1_axes, k2_axes, 3)
        return f(args[0]), layout, f.lower(args[0]).compile().as_text()

    with jax.set_mesh(mesh), lj.autocast(mesh_resource=resource):
        y_te, layout_te, hlo_te = run(te_x, te_k1, te_k2)
    with jax.set_mesh(mesh):
        y_mesh, layout_mesh, hlo_mesh = run(mesh_x, mesh_k1, mesh_k2)
    assert layout_te == layout_mesh and layout_te.tensor_axes == ("tensor",)
    assert layout_te.sequence_parallel == (kind == "sp")
    np.testing.assert_array_equal(np.asarray(y_te), np.asarray(y_mesh))
    for op in ("all-reduce", "all-gather", "reduce-scatter"):
        assert hlo_te.count(f" {op}(") == hlo_mesh.count(f" {op}("), op
    y, _ = ref.forward(np.asarray(d["x"], np.float64).reshape(-1, H), d["gamma"], d["beta"], d["k1"], d["b1"],
                       d["k2"], d["b2"], "layernorm", False, 1e-6, ("gelu",), {})
    ref.assert_close(f"nvte axes {kind}", np.asarray(y_te, np.float64).reshape(-1, H), y, "float32")


def test_extend_logical_axis_rules_and_clear_errors():
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    resource = lj.MeshResource(dp_resource="data", tp_resource="tensor")
    with jax.set_mesh(mesh), lj.autocast(mesh_resource=resource):
        rules = extend_logical_axis_rules((("batch", "data"),))
        assert rules[0] == ("batch", "data") and ("nvte_w_tp", "tensor") in rules and ("nvte_batch", "data") in rules
        with pytest.raises(lnmlp.InvalidArgumentError, match="nvte_w_tp"):
            extend_logical_axis_rules((("nvte_w_tp", "data"),))
        with pytest.raises(lnmlp.InvalidArgumentError, match="not one of TransformerEngine's"):
            _sharding._mesh_axes(("nvte_nonsense",), mesh, "kernel_2_axes")
    with jax.set_mesh(mesh):
        with pytest.raises(lnmlp.InvalidArgumentError, match="MeshResource"):
            _sharding._mesh_axes(("nvte_batch", None), mesh, "norm_input_axes")
    with pytest.raises(lnmlp.InvalidArgumentError, match="mesh_resource must be"):
        with lj.autocast(mesh_resource=("data", "tensor")):
            pass
    with pytest.raises(lnmlp.InvalidArgumentError, match="recipe must be"):
        with lj.autocast(enabled=True, recipe="delayed"):
            pass
