"""lnmlp.jax with NVFP4BlockScaling: under jax.jit and jax.grad the block computes what the
independent simulation of TransformerEngine's recipe computes (_nvfp4_sim through _fp8_sim.Sim,
with test_nvfp4_recipe.py's tolerances) from the quantizer set's random state; and what an
lnmlp.Plan given that state computes, bit for bit (so the recipe's options and the random state
reach the plan the custom calls run). ``qs.advanced()`` moves the state on as a Plan's backward
does; the halves of ``quantizer_sets`` carry it whole; split over a mesh by axes arguments the block
gives the unsplit block's results (amaxes reduced, random streams placed); a mesh found in the
operands' shardings runs the block whole.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import lnmlp
import lnmlp.jax as lj
from test_fp8_recipes import make_dy, plan_for, step, inputs_for
from test_nvfp4_recipe import CONFIGS, OPTIONS, check_against_the_simulation, problem

SEED, OFFSET = 0x0123456789ABCDEF, 0xFFFFFFFF  # the offset's low word about to carry
ARGS = ("x", "gamma", "beta", "w1", "b1", "w2", "b2")
GRADS = ("dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2")


def _jax_step(cfg, qs, inp, dy, **kw):
    """y and the gradients of one jitted step, the quantizer set an operand (not differentiated:
    its random state is an integer array)."""
    T, H, F, norm, acts, dtype, bias = cfg

    def loss(x, gamma, beta, w1, b1, w2, b2, qs):
        y = lj.layernorm_mlp(x, gamma, beta, [w1, w2], [b1, b2], norm, activation_type=acts, quantizer_set=qs, **kw)
        return jnp.sum(y.astype(jnp.float32) * jnp.asarray(dy, jnp.float32)), y

    args = [None if inp[k] is None else jnp.asarray(inp[k]) for k in ARGS]
    (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(7)), has_aux=True))(*args, qs)
    return np.asarray(y), {k: None if g is None else np.asarray(g) for k, g in zip(GRADS, grads)}


def _plan_step(cfg, recipe, inp, dy, seed, offset):
    plan = plan_for(cfg, recipe)
    plan.set_rng_state(seed, offset)
    return step(plan, inp, dy)


def _assert_same_bits(got, want, what):
    for k, v in want.items():
        if v is None or got[k] is None:
            continue
        np.testing.assert_array_equal(got[k].reshape(-1), np.asarray(v).reshape(-1), err_msg=f"{what}: {k}")


@pytest.mark.parametrize("opt", ["te-default", "all-off", "sr-2d"])
@pytest.mark.parametrize("cfg_id", ["ln-gelu-partial", "ln-geglu-bf16"])
def test_jit_grad_matches_the_simulation_and_the_plan(cfg_id, opt):
    cfg, recipe, spec, inp, dy = problem(cfg_id, opt, 7)
    qs = lj.make_quantizer_set(recipe, seed=SEED)
    if recipe.draws_random:
        qs = qs.with_rng_state(SEED, OFFSET)
        assert qs.rng_state() == (SEED, OFFSET)
    else:
        assert qs.state is None
    y, g = _jax_step(cfg, qs, inp, dy)

    check_against_the_simulation(cfg, spec, inp, dy, y, g, SEED, OFFSET, prefix="jax ")
    plan_y, plan_g = _plan_step(cfg, recipe, inp, dy, SEED, OFFSET)
    _assert_same_bits(dict(y=y, **g), dict(y=plan_y, **plan_g), f"{cfg_id} {opt}")


def test_advanced_moves_the_random_state_on_as_a_plans_backward_does():
    cfg = CONFIGS["rms-swiglu"]
    recipe = lnmlp.NVFP4BlockScaling(disable_stochastic_rounding=False)
    inp = inputs_for(cfg, 8)
    dy = make_dy(cfg[0], cfg[1], cfg[5], 8)
    qs = lj.make_quantizer_set(recipe).with_rng_state(SEED, OFFSET)
    _, first = _jax_step(cfg, qs, inp, dy)
    nxt = jax.jit(lambda q: q.advanced())(qs)
    assert nxt.rng_state() == (SEED, OFFSET + 1), "the offset's carry reaches its high word"
    _, second = _jax_step(cfg, nxt, inp, dy)
    assert not np.array_equal(first["dw2"], second["dw2"]), "a new offset draws other bits"
    _, want = _plan_step(cfg, recipe, inp, dy, SEED, OFFSET + 1)
    _assert_same_bits(second, want, "after advanced()")
    _, again = _jax_step(cfg, qs, inp, dy)
    _assert_same_bits(again, first, "the same state again")
    # Each set draws its own stream by default; a seed out of range is refused as the NumPy API refuses it.
    assert lj.make_quantizer_set(recipe).rng_state()[0] != lj.make_quantizer_set(recipe).rng_state()[0]
    with pytest.raises(lnmlp.InvalidArgumentError):
        lj.make_quantizer_set(recipe, seed=2 ** 64)
    for no_rng in (lj.make_quantizer_set(lnmlp.NVFP4BlockScaling(disable_stochastic_rounding=True)),
                   lj.make_quantizer_set(lj.MXFP8BlockScaling())):
        with pytest.raises(lnmlp.InvalidArgumentError, match="does not round stochastically"):
            no_rng.advanced()
    with pytest.raises(lnmlp.InvalidArgumentError, match="uint32"):
        _jax_step(cfg, lj.QuantizerSet(recipe, jnp.zeros((4,), jnp.float32)), inp, dy)


def test_the_halves_of_quantizer_sets_carry_the_random_state_whole():
    cfg = CONFIGS["ln-gelu-partial"]
    recipe = lnmlp.NVFP4BlockScaling()
    inp = inputs_for(cfg, 9)
    dy = make_dy(cfg[0], cfg[1], cfg[5], 9)
    qs = lj.make_quantizer_set(recipe, seed=SEED)
    ffn1, ffn2 = lj.make_quantizer_sets(recipe, seed=SEED)
    _, whole = _jax_step(cfg, qs, inp, dy)
    _, halves = _jax_step(cfg, None, inp, dy, quantizer_sets=(ffn1, ffn2))
    _assert_same_bits(halves, whole, "quantizer_sets=(ffn1, ffn2)")


# F / 2 = 64: whole blocks of 16 on each of two tensor shards; 64 tokens: whole Hadamard blocks on
# each of two data shards.
MESH_CFG = (64, 64, 128, "layernorm", ("gelu", "linear"), np.float32, True)
TENSOR = dict(kernel_1_axes=(None, None, "tensor"), kernel_2_axes=("tensor", None))
MESH_LAYOUTS = {
    "dp": dict(norm_input_axes=("data", None)),
    "tp": TENSOR,
    "dp-tp": dict(norm_input_axes=("data", None), **TENSOR),
    # x as [2, 32, H]: a batch row per data shard, its sequence split over the tensor axis, so the
    # rows a call gathers are a contiguous run of the tokens.
    "dp-sp": dict(norm_input_axes=("data", "tensor", None), **TENSOR),
}


def _mesh():
    if len(jax.devices()) < 4:
        pytest.skip("needs four devices (the suite's XLA_FLAGS give the CPU eight)")
    return jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


@pytest.mark.parametrize("opt", ["te-default", "all-off"])
@pytest.mark.parametrize("layout", list(MESH_LAYOUTS))
def test_a_mesh_gives_the_unsplit_calls_results(layout, opt):
    """Split over a 2 x 2 mesh, the amaxes max-reduced between the stages and each call placed in
    the random stream: y and every gradient are the unsplit block's within fp32 summation order
    (GEMM2's and dn's partial sums, the weight gradients' sums over the data shards) -- the same
    global scales, codes and random bits on every shard."""
    mesh = _mesh()
    cfg = MESH_CFG
    T, H, F, norm, acts, dtype, bias = cfg
    recipe = lnmlp.NVFP4BlockScaling(**dict(zip(("disable_rht", "disable_stochastic_rounding",
                                                 "disable_2d_quantization"), OPTIONS[opt])))
    inp = inputs_for(cfg, 11)
    dy = make_dy(T, H, dtype, 11)
    qs = lj.make_quantizer_set(recipe, seed=SEED)
    want_y, want = _jax_step(cfg, qs, inp, dy)
    if layout == "dp-sp":
        inp, dy = dict(inp, x=inp["x"].reshape(2, T // 2, H)), dy.reshape(2, T // 2, H)
    with jax.set_mesh(mesh):
        got_y, got = _jax_step(cfg, qs, inp, dy, **MESH_LAYOUTS[layout])
        args = [None if inp[k] is None else jnp.asarray(inp[k]) for k in ARGS]
        inferred = jax.jit(lambda x, g, b, w1, b1, w2, b2: lj.layernorm_mlp(
            x, g, b, [w1, w2], [b1, b2], norm, activation_type=acts, quantizer_set=qs, **MESH_LAYOUTS[layout]))(*args)
    outputs = [("y", got_y, want_y), ("y without grad", np.asarray(inferred), want_y)]
    errors = {name: float(np.max(np.abs(g.reshape(w.shape) - w)) / np.max(np.abs(w)))
              for name, g, w in outputs + [(k, got[k], want[k]) for k in GRADS if want[k] is not None]}
    worst = max(errors, key=errors.get)
    print(f"NVFP4 2x2 mesh {layout:6s} {opt:10s}: worst {worst} {errors[worst]:.2g} of its largest "
          f"(exactly equal: {', '.join(k for k, e in errors.items() if e == 0) or 'none'})")
    for name, err in errors.items():
        assert err < 1e-5, f"{layout} {opt}: {name} differs from the unsplit block by {err:.3g} of its largest"


def test_a_mesh_splits_f_into_whole_blocks_of_16_only_and_auto_placement_runs_whole():
    mesh = _mesh()
    cfg = CONFIGS["ln-gelu-partial"]  # F = 200: 100 per tensor shard
    T, H, F, norm, acts, dtype, bias = cfg
    recipe = lnmlp.NVFP4BlockScaling()
    inp = inputs_for(cfg, 10)
    dy = make_dy(T, H, dtype, 10)
    qs = lj.make_quantizer_set(recipe, seed=SEED)
    with jax.set_mesh(mesh):
        with pytest.raises(lnmlp.NotSupportedError, match="whole blocks of 16"):
            _jax_step(cfg, qs, inp, dy, **TENSOR)
    _, whole = _jax_step(cfg, qs, inp, dy)
    placed = dict(inp, x=jax.device_put(jnp.asarray(inp["x"]), NamedSharding(mesh, P("data", None))))
    _, auto = _jax_step(cfg, qs, placed, dy)
    _assert_same_bits(auto, whole, "tokens placed over a mesh")


def test_the_flax_module_draws_its_seed_from_the_sr_rng_stream():
    """lnmlp.jax.flax.LayerNormMLP under NVFP4: the seed of each apply's stochastic rounding is 64
    bits of the "sr_rng" stream (the same key: the same gradients; another key: others); without
    the stream its gradients are layernorm_mlp's with the random state (0, 0)."""
    import flax.linen as nn
    from lnmlp.jax.flax import LayerNormMLP
    recipe = lnmlp.NVFP4BlockScaling()
    model = LayerNormMLP(intermediate_dim=48, activations=("gelu",), use_bias=True, fp8_recipe=recipe)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 16, 32)), jnp.float32)
    variables = nn.unbox(model.init(jax.random.key(0), x))

    def grads(key):
        rngs = {} if key is None else {"sr_rng": key}
        loss = lambda v: jnp.sum(jnp.sin(model.apply(v, x, rngs=rngs)[0]))  # noqa: E731
        return jax.jit(jax.grad(loss))(variables)["params"]["wo_kernel"]

    a, b, c = grads(jax.random.key(1)), grads(jax.random.key(1)), grads(jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c), "another key draws other bits"
    p = variables["params"]
    qs = lj.make_quantizer_set(recipe).with_rng_state(0, 0)

    def loss(w2):
        y = lj.layernorm_mlp(x, p["scale"], p["ln_bias"], [p["wi_kernel"], w2], [p["wi_bias"], p["wo_bias"]],
                             "layernorm", activation_type=("gelu",), quantizer_set=qs)
        return jnp.sum(jnp.sin(y))

    without = grads(None)  # without the stream: the state (0, 0)
    np.testing.assert_array_equal(without, jax.jit(jax.grad(loss))(p["wo_kernel"]))
    assert not np.array_equal(without, a)
