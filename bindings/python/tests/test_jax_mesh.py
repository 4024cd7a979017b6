"""lnmlp.jax on a device mesh of 8 CPU devices (conftest.py sets XLA_FLAGS): data, tensor and
sequence parallelism through layernorm_mlp's axes arguments, XLA doing the collectives.

Each configuration runs one jitted value-and-grad step over inputs placed with NamedSharding, and
the same step on one device; y and every gradient must equal the one-device call within the
dtype's tolerance (and, without FP8, the float64 reference too), and the compiled HLO must show
the collectives docs/jax-mesh.md lists for the layout and no all-gather of a weight.
"""

import os
import re

import numpy as np
import pytest

import _reference as ref
from _block_cases import EPS, make

if os.environ.get("LNMLP_REQUIRE_JAX") == "1":  # the README's test command: never skip silently
    import jax
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import lnmlp  # noqa: E402
import lnmlp.jax as lj  # noqa: E402

B, S, H, F = 4, 16, 64, 128  # T = 64 tokens; F/4 = 32 (whole MXFP8 blocks, partial BLOCK tiles)
NAMES = ("x", "gamma", "beta", "k1", "k2", "b1", "b2")
MESHES = [(1, 2), (2, 2), (1, 4)]  # (data, tensor)
BLOCKS = [("layernorm", ("gelu",)), ("rmsnorm", ("silu", "linear"))]

if jax.device_count() < 8:
    if os.environ.get("LNMLP_REQUIRE_JAX") == "1":
        raise RuntimeError(f"the mesh tests need 8 CPU devices, jax has {jax.device_count()}: XLA_FLAGS was set too "
                           "late (conftest.py sets it before jax is imported)")
    pytest.skip("fewer than 8 jax devices", allow_module_level=True)


def _mesh(dp, tp):
    return jax.make_mesh((dp, tp), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _axes(sp):
    tokens = ("data", "tensor" if sp else None, None)
    return dict(norm_input_axes=tokens, kernel_1_axes=(None, None, "tensor"), kernel_2_axes=("tensor", None))


def _specs(sp):
    return dict(x=P("data", "tensor" if sp else None, None), gamma=P(), beta=P(), k1=P(None, None, "tensor"),
                k2=P("tensor", None), b1=P(None, "tensor"), b2=P())


def _step(norm, acts, dy, axes, recipe):
    """A jitted value-and-grad of sum(y * dy) over the seven tensors (and the quantizer set)."""

    def loss(x, gamma, beta, k1, k2, b1, b2, qs):
        y = lj.layernorm_mlp(x, gamma, beta, [k1, k2], [b1, b2], norm, epsilon=EPS, activation_type=acts,
                             quantizer_set=qs, **axes)
        return jnp.sum(y.astype(jnp.float32) * dy), y

    argnums = tuple(range(8 if recipe is not None and recipe.stateful else 7))
    return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))


def _collectives(hlo):
    """[(op, output type)] of every collective in compiled HLO text."""
    return re.findall(r"=\s*(\S.*?)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                      r"(?:-start)?\(", hlo)


def _check_collectives(hlo, dp, sp):
    """The collectives a layout must compile to (docs/jax-mesh.md), as a summary string."""
    found = _collectives(hlo)
    ops = {op for _, op in found}
    assert not ops & {"all-to-all", "collective-permute"}, found
    gathers = [t for t, op in found if op == "all-gather"]
    rows = B * S // dp
    if sp:
        assert {"all-gather", "reduce-scatter"} <= ops, found
        # Only rows of x and dy are gathered: [T/dp, H] (XLA:CPU may gather bf16 as f32).
        for t in gathers:
            assert re.fullmatch(r"(f32|bf16)\[%d,%d\]\{1,0\}" % (rows, H), t), \
                f"all-gather of {t}: not x's or dy's rows"
    else:
        assert not gathers, f"all-gather without sequence parallelism: {gathers}"
        assert "reduce-scatter" not in ops, found
        assert "all-reduce" in ops, found
    counts = {op: sum(1 for _, o in found if o == op) for op in sorted(ops)}
    return ", ".join(f"{n} {op}" for op, n in counts.items())


def _max_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape and np.all(np.isfinite(got))
    return float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)


def _one_device_and_mesh(d, norm, acts, dy, mesh, specs, axes, recipe=None):
    """The jitted step on one device and over `mesh` (inputs placed by `specs`, the block given
    `axes`): the mesh's (y, grads), the one device's, the compiled mesh step's HLO text, and the
    largest error per output ("y", "dx", ...) against the one device."""
    qs = lj.make_quantizer_set(recipe) if recipe is not None else None
    args = [d[n] for n in NAMES] + [qs]
    (_, y1), g1 = _step(norm, acts, dy, {}, recipe)(*args)
    placed = [jax.device_put(a, NamedSharding(mesh, specs[n])) if a is not None else None
              for n, a in zip(NAMES, args)] + [qs]
    with jax.set_mesh(mesh):
        step = _step(norm, acts, dy, axes, recipe)
        (_, ym), gm = step(*placed)
        hlo = step.lower(*placed).compile().as_text()
    errs = {"y": _max_err(ym, y1)}
    for n, a, b in zip(NAMES, gm, g1):
        if d[n] is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, n
            errs["d" + n] = _max_err(a, b)
    return (ym, gm), (y1, g1), hlo, errs


def _run(dp, tp, sp, norm, acts, dtype_name, recipe=None, what=None, ffn=F):
    dtype = ref.DTYPES[dtype_name]
    d = make(len(acts), dtype, lead=(B, S), norm=norm, seed=11, H=H, F=ffn)
    # The float64 answer for a dy the block can take exactly (in the I/O dtype).
    x2 = np.asarray(d["x"], np.float64).reshape(-1, H)
    block = (x2, d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"], norm, False, EPS, acts, {})
    y_ref, _ = ref.forward(*block)
    dy = np.cos(np.arange(y_ref.size, dtype=np.float64)).reshape(y_ref.shape).astype(dtype).astype(np.float64)
    g_ref = ref.backward(dy, *block)
    dy = jnp.asarray(dy.reshape(B, S, H), jnp.float32)
    (ym, gm), (_, g1), hlo, errs = _one_device_and_mesh(d, norm, acts, dy, _mesh(dp, tp), _specs(sp), _axes(sp),
                                                         recipe)
    summary = _check_collectives(hlo, dp, sp)

    tol = ref.TOLERANCE_FP8_SHARDED if recipe is not None else ref.TOLERANCES[dtype_name]
    worst = max(errs, key=errs.get)
    assert errs[worst] <= tol, f"{worst}: {errs[worst]:.3e} from the one-device call > {tol}"
    if recipe is None:  # the float64 reference, independently of the one-device call
        ref.assert_close("mesh y", np.asarray(ym).reshape(-1, H), y_ref, dtype_name)
        want = dict(x=g_ref["dx"], gamma=g_ref["dgamma"], beta=g_ref["dbeta"], k1=g_ref["dw1"], k2=g_ref["dw2"],
                    b1=g_ref["db1"], b2=g_ref["db2"])
        for n, g in zip(NAMES, gm):
            if d[n] is not None:
                ref.assert_close(f"mesh d{n}", np.asarray(g).reshape(want[n].shape), want[n], dtype_name)
    if recipe is not None and recipe.stateful:
        state = gm[7].state
        copies = [np.asarray(s.data) for s in state.addressable_shards]
        assert all(np.array_equal(c, copies[0], equal_nan=True) for c in copies), "the state differs between devices"
        one = np.asarray(g1[7].state)
        # w1, w2 and dy's amaxes are of the same values; ln_out's, act_out's and dh's of values
        # computed in another order of sums (test_fp8_recipes.py's AMAX_RTOL is for the same
        # order), and the scales follow them.
        np.testing.assert_allclose(copies[0], one, rtol=1e-3, err_msg="the state differs from the one-device call")
    ref.MESH_REPORT.append(f"{dp}x{tp} {'SP' if sp else '  '} {norm:9s} {'+'.join(acts):12s} {dtype_name:8s} "
                           f"{what or '':19s} max error {errs[worst]:.1e} ({worst:6s}) HLO: {summary}")


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("norm, acts", BLOCKS, ids=lambda v: v if isinstance(v, str) else "_".join(v))
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
@pytest.mark.parametrize("dp, tp", MESHES, ids=lambda v: str(v))
def test_mesh_equals_one_device(dp, tp, sp, norm, acts, dtype_name):
    _run(dp, tp, sp, norm, acts, dtype_name)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_data_parallel_alone_equals_one_device(dtype_name):
    """x's batch over a 4-way data axis, the weights whole: each device's gradients summed."""
    dtype = ref.DTYPES[dtype_name]
    d = make(1, dtype, lead=(B, S), seed=8, H=H, F=F)
    dy = jnp.asarray(np.cos(np.arange(B * S * H)).reshape(B, S, H).astype(dtype), jnp.float32)
    mesh = jax.make_mesh((4, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    specs = {n: P("data", None, None) if n == "x" else P() for n in NAMES}
    _, _, hlo, errs = _one_device_and_mesh(d, "layernorm", ("gelu",), dy, mesh, specs,
                                           dict(norm_input_axes=("data", None, None)))
    found = _collectives(hlo)
    assert {op for _, op in found} == {"all-reduce"}, found
    worst = max(errs, key=errs.get)
    assert errs[worst] <= ref.TOLERANCES[dtype_name], errs
    ref.MESH_REPORT.append(f"4x1    data parallel alone, {dtype_name}: max error {errs[worst]:.1e} ({worst})  "
                           f"HLO: {len(found)} all-reduce")


FP8_RECIPES = {"delayed": lambda: lj.DelayedScaling(amax_history_len=4),
               "delayed-most-recent": lambda: lj.DelayedScaling(margin=1, amax_history_len=4,
                                                                amax_compute_algo="most_recent"),
               "current": lambda: lj.Float8CurrentScaling(),
               "block": lambda: lj.Float8BlockScaling(), "mxfp8": lambda: lj.MXFP8BlockScaling()}


@pytest.mark.parametrize("rid", list(FP8_RECIPES))
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
@pytest.mark.parametrize("dp, tp", MESHES, ids=lambda v: str(v))
def test_fp8_on_a_mesh_equals_one_device(dp, tp, sp, rid):
    norm, acts = BLOCKS[1] if rid.startswith("delayed") else BLOCKS[0]
    _run(dp, tp, sp, norm, acts, "bfloat16", FP8_RECIPES[rid](), rid)


def test_block_scaling_without_powers_of_2_needs_whole_128_column_shards():
    """As docs/sharding.md says: with arbitrary block scales a partial block would be scaled
    differently from the one-device call, so F/P must be a multiple of 128."""
    _run(1, 2, True, "layernorm", ("gelu",), "bfloat16", lj.Float8BlockScaling(power_2_scale=False),
         "block-nop2 F=256", ffn=256)
    with pytest.raises(lnmlp.NotSupportedError, match="multiple of 128"):
        _run(1, 2, False, "layernorm", ("gelu",), "bfloat16", lj.Float8BlockScaling(power_2_scale=False))


def test_delayed_state_stays_identical_over_steps():
    """Three steps, each fed the state the last one returned: every device holds the same state,
    and it equals the one-device run's."""
    recipe = lj.DelayedScaling(amax_history_len=3)
    d = make(2, ref.DTYPES["bfloat16"], lead=(B, S), norm="rmsnorm", seed=5, H=H, F=F)
    dy = jnp.asarray(np.cos(np.arange(B * S * H)).reshape(B, S, H), jnp.float32)
    mesh = _mesh(2, 2)
    one, sharded = lj.make_quantizer_set(recipe), lj.make_quantizer_set(recipe)
    args = [d[n] for n in NAMES]
    placed = [jax.device_put(a, NamedSharding(mesh, _specs(True)[n])) for n, a in zip(NAMES, args)]
    step = _step("rmsnorm", ("silu", "linear"), dy, {}, recipe)
    for _ in range(3):
        one = step(*args, one)[1][7]
        with jax.set_mesh(mesh):
            sharded = _step("rmsnorm", ("silu", "linear"), dy, _axes(True), recipe)(*placed, sharded)[1][7]
    copies = [np.asarray(s.data) for s in sharded.state.addressable_shards]
    assert all(np.array_equal(c, copies[0]) for c in copies)
    np.testing.assert_allclose(copies[0], np.asarray(one.state), rtol=1e-3)
    assert np.all(copies[0][:, 1:] > 0), "a history entry was not recorded"


def test_current_scaling_on_a_mesh_quantizes_with_the_groups_amaxes():
    """Float8CurrentScaling runs each call in stages, the amaxes max-reduced between them, so every
    device quantizes with the one-device call's scales: y equals the one-device y to the fp32 sums'
    order (bf16 rounding), far inside what scales of each device's own part would give."""
    d = make(2, ref.DTYPES["bfloat16"], lead=(B, S), norm="rmsnorm", seed=9, H=H, F=F)
    dy = jnp.asarray(np.cos(np.arange(B * S * H)).reshape(B, S, H), jnp.float32)
    (ym, _), (y1, _), hlo, errs = _one_device_and_mesh(d, "rmsnorm", ("silu", "linear"), dy, _mesh(2, 2),
                                                       _specs(True), _axes(True), lj.Float8CurrentScaling())
    assert errs["y"] <= ref.TOLERANCES["bfloat16"] / 4, errs
    assert max(errs.values()) <= ref.TOLERANCE_FP8_SHARDED, errs
    # The stages: four amax reductions (two per pass) beside the block's own collectives.
    reductions = [t for t, op in _collectives(hlo) if op == "all-reduce" and re.match(r"f32\[6\]", t)]
    assert len(reductions) >= 4, _collectives(hlo)


@pytest.mark.parametrize("axes, error, match", [
    (dict(kernel_1_axes=(None, None, "tensor"), kernel_2_axes=(None, "tensor")), lnmlp.InvalidArgumentError,
     "same tensor axis"),
    (dict(norm_input_axes=("data", None, "tensor")), lnmlp.NotSupportedError, "hidden dimension"),
    (dict(norm_input_axes=("data", None)), lnmlp.InvalidArgumentError, "2 names for x's 3 dimensions"),
    (dict(kernel_1_axes=(None, None, "nope"), kernel_2_axes=("nope", None)), None, None),
    # FSDP splits H over axes that split the tokens, never over the tensor axis.
    (dict(kernel_1_axes=("data", None, "tensor"), kernel_2_axes=("tensor", "data")), lnmlp.NotSupportedError,
     "kernel_1's H dimension is split over mesh axes"),
    (dict(norm_input_axes=("data", None, None), kernel_1_axes=(None, None, "tensor"),
          kernel_2_axes=("tensor", "tensor")), lnmlp.NotSupportedError, "kernel_2's H dimension"),
])
def test_bad_axes_raise_a_clear_error(axes, error, match):
    d = make(1, np.float32, lead=(B, S), H=H, F=F)
    call = lambda: lj.layernorm_mlp(d["x"], d["gamma"], d["beta"], [d["k1"], d["k2"]],  # noqa: E731
                                    [d["b1"], d["b2"]], "layernorm", **axes)
    with jax.set_mesh(_mesh(2, 2)):
        if error is None:  # a name that is neither a mesh axis nor a logical rule's: not split
            assert not _collectives(jax.jit(call).lower().compile().as_text())
            return
        with pytest.raises(error, match=match):
            call()


def test_axes_without_a_mesh_change_nothing():
    d = make(1, np.float32, lead=(B, S), H=H, F=F)
    args = (d["x"], d["gamma"], d["beta"], [d["k1"], d["k2"]], [d["b1"], d["b2"]], "layernorm")
    np.testing.assert_array_equal(np.asarray(lj.layernorm_mlp(*args, **_axes(True))),
                                  np.asarray(lj.layernorm_mlp(*args)))


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_shardings_in_types_split_the_block_without_axes(sp):
    """On a mesh of Explicit axes the arrays' types carry their shardings: a plain jit over
    inputs placed with NamedSharding splits the block as the axes arguments would."""
    d = make(2, np.float32, lead=(B, S), norm="rmsnorm", seed=2, H=H, F=F)
    dy = jnp.asarray(np.cos(np.arange(B * S * H)).reshape(B, S, H), jnp.float32)
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    (ym, gm), _, hlo, errs = _one_device_and_mesh(d, "rmsnorm", ("silu", "linear"), dy, mesh, _specs(sp), {})
    summary = _check_collectives(hlo, 2, sp)
    assert ym.sharding.spec == _specs(sp)["x"] and gm[3].sharding.spec == _specs(sp)["k1"]
    worst = max(errs, key=errs.get)
    assert errs[worst] <= ref.TOLERANCES["float32"], errs
    ref.MESH_REPORT.append(f"2x2 {'SP' if sp else '  '} explicit axes, no axes arguments: max error "
                           f"{errs[worst]:.1e} ({worst})  HLO: {summary}")


AUTO_CASES = [(1, 2, "tp", None), (2, 2, "tp", None), (2, 2, "sp", None), (1, 4, "sp", None),
              (2, 2, "fsdp", None), (2, 2, "tp", "current"), (2, 2, "sp", "delayed")]


@pytest.mark.parametrize("dp, tp, layout, rid", AUTO_CASES, ids=lambda v: str(v))
def test_a_plain_jit_over_named_shardings_splits_inference_as_the_axes_do(dp, tp, layout, rid):
    """Issue 50's Auto mesh: jax.jit over inputs placed with NamedSharding on a mesh of Auto axes,
    no axes arguments, no mesh context. The block, not differentiated, is partitioned from the
    operands' shardings: y is bit for bit what the axes arguments give on that mesh, within the
    dtype's tolerance of one device, and the compiled HLO has the axes path's collectives (no
    all-gather of a weight but FSDP's, which gathers the kernels' H shards as the axes path does)."""
    recipe = FP8_RECIPES[rid]() if rid else None
    dtype_name = "bfloat16" if recipe else "float32"
    d = make(1, ref.DTYPES[dtype_name], lead=(B, S), seed=23, H=H, F=F)
    mesh = _mesh(dp, tp)
    specs, axes = _specs(layout == "sp"), _axes(layout == "sp")
    if layout == "fsdp":
        specs = dict(specs, k1=P("data", None, "tensor"), k2=P("tensor", "data"))
        axes = dict(axes, kernel_1_axes=("data", None, "tensor"), kernel_2_axes=("tensor", "data"))

    def forward(axes):
        def f(x, gamma, beta, k1, k2, b1, b2):
            return lj.layernorm_mlp(x, gamma, beta, [k1, k2], [b1, b2], "layernorm", epsilon=EPS,
                                    activation_type=("gelu",), quantizer_set=lj.make_quantizer_set(recipe)
                                    if recipe else None, **axes)
        return jax.jit(f)

    args = [d[n] for n in NAMES]
    y1 = forward({})(*args)
    placed = [jax.device_put(a, NamedSharding(mesh, specs[n])) for n, a in zip(NAMES, args)]
    auto = forward({})
    y_auto = auto(*placed)
    auto_hlo = auto.lower(*placed).compile().as_text()
    with jax.set_mesh(mesh):
        given = forward(axes)
        y_axes = given(*placed)
        axes_hlo = given.lower(*placed).compile().as_text()
    np.testing.assert_array_equal(np.asarray(y_auto, np.float64), np.asarray(y_axes, np.float64))
    tol = ref.TOLERANCE_FP8_SHARDED if recipe else ref.TOLERANCES[dtype_name]
    err = _max_err(y_auto, y1)
    assert err <= tol, f"y: {err:.3e} from the one-device call > {tol}"
    found, want = _collectives(auto_hlo), _collectives(axes_hlo)
    assert sorted(found) == sorted(want), (found, want)
    assert "all-reduce" in {op for _, op in found} or layout == "sp", found
    gathers = [t for t, op in found if op == "all-gather"]
    if layout == "tp":
        assert not gathers, gathers
    counts = {op: sum(1 for _, o in found if o == op) for op in sorted({op for _, op in found})}
    ref.MESH_REPORT.append(f"{dp}x{tp} auto {layout:4s} {rid or dtype_name:8s} inference, no axes: max error "
                           f"{err:.1e} (y)  HLO: {', '.join(f'{n} {op}' for op, n in counts.items())}")


TRAIN_CASES = [(1, 2, "tp", None), (2, 2, "tp", None), (2, 2, "sp", None), (1, 4, "sp", None),
               (2, 2, "fsdp", None), (2, 2, "tp", "delayed"), (2, 2, "sp", "current")]


@pytest.mark.parametrize("dp, tp, layout, rid", TRAIN_CASES, ids=lambda v: str(v))
def test_a_plain_jit_over_named_shardings_splits_a_training_step_as_the_axes_do(dp, tp, layout, rid):
    """Issue 50's Auto mesh, differentiated: a jitted value-and-grad step over inputs placed with
    NamedSharding, no axes arguments. Forward and backward are partitioned from the operands'
    shardings, the residual's sections passed between them as they lie: y and every gradient are
    bit for bit what the axes arguments give, within tolerance of one device, and the compiled
    step gathers no weight (but FSDP's H shards, as the axes path does) and no residual: with
    tensor and data parallelism its collectives are the axes path's; with sequence parallelism each
    all-gather is of x's or dy's rows; under FSDP of the kernels' H shards."""
    recipe = FP8_RECIPES[rid]() if rid else None
    dtype_name = "bfloat16" if recipe else "float32"
    norm, acts = BLOCKS[0]
    d = make(len(acts), ref.DTYPES[dtype_name], lead=(B, S), norm=norm, seed=31, H=H, F=F)
    dy = jnp.asarray(np.cos(np.arange(B * S * H)).reshape(B, S, H).astype(ref.DTYPES[dtype_name]), jnp.float32)
    mesh = _mesh(dp, tp)
    specs, axes = _specs(layout == "sp"), _axes(layout == "sp")
    if layout == "fsdp":
        specs = dict(specs, k1=P("data", None, "tensor"), k2=P("tensor", "data"))
        axes = dict(axes, kernel_1_axes=("data", None, "tensor"), kernel_2_axes=("tensor", "data"))
    (ya, ga), _, auto_hlo, errs = _one_device_and_mesh(d, norm, acts, dy, mesh, specs, {}, recipe)
    (yx, gx), _, axes_hlo, _ = _one_device_and_mesh(d, norm, acts, dy, mesh, specs, axes, recipe)
    np.testing.assert_array_equal(np.asarray(ya, np.float64), np.asarray(yx, np.float64))
    for n, a, b in zip(NAMES, ga, gx):
        if d[n] is not None:
            np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), err_msg=n)
    tol = ref.TOLERANCE_FP8_SHARDED if recipe else ref.TOLERANCES[dtype_name]
    worst = max(errs, key=errs.get)
    assert errs[worst] <= tol, f"{worst}: {errs[worst]:.3e} from the one-device call > {tol}"
    found = _collectives(auto_hlo)
    gathers = [t for t, op in found if op == "all-gather"]
    rows = B * S // dp
    if layout == "sp":
        for t in gathers:
            assert re.fullmatch(r"(f32|bf16)\[%d,%d\]\{1,0\}" % (rows, H), t), f"all-gather of {t}: not rows"
    elif layout == "fsdp":  # the kernels' H shards gathered (in forward and again in backward)
        for t in gathers:
            assert re.fullmatch(r"f32\[(%d,1,%d|%d,%d)\]\{.*\}" % (H, F // tp, F // tp, H), t), t
        assert "reduce-scatter" in {op for _, op in found}, found
    else:
        assert sorted(found) == sorted(_collectives(axes_hlo)), (found, _collectives(axes_hlo))
        assert not gathers, gathers
    counts = {op: sum(1 for _, o in found if o == op) for op in sorted({op for _, op in found})}
    ref.MESH_REPORT.append(f"{dp}x{tp} auto {layout:4s} {rid or dtype_name:8s} training, no axes: max error "
                           f"{errs[worst]:.1e} ({worst})  HLO: {', '.join(f'{n} {op}' for op, n in counts.items())}")


def test_a_plain_jit_over_shardings_the_block_cannot_run_moves_the_data():
    """x's hidden dimension split, and W1's and W2's F over different axes: the block is run on
    shardings it can run, XLA moving the data, and y is still one device's."""
    d = make(1, np.float32, lead=(B, S), seed=29, H=H, F=F)
    mesh = _mesh(2, 2)
    specs = dict(_specs(False), x=P(None, None, "tensor"), k1=P(None, None, "data"), k2=P("tensor", None))
    f = jax.jit(lambda x, gamma, beta, k1, k2, b1, b2: lj.layernorm_mlp(x, gamma, beta, [k1, k2], [b1, b2],
                                                                       "layernorm", epsilon=EPS))
    args = [d[n] for n in NAMES]
    placed = [jax.device_put(a, NamedSharding(mesh, specs[n])) for n, a in zip(NAMES, args)]
    err = _max_err(f(*placed), f(*args))
    assert err <= ref.TOLERANCES["float32"], err


@pytest.mark.parametrize("explicit", [False, True], ids=["axes", "explicit"])
@pytest.mark.parametrize("rid", ["none", "delayed"])
def test_fsdp_gathers_the_kernels_and_reduce_scatters_their_gradients(rid, explicit):
    """FSDP: the kernels' H dimension split over the data axis too (W1 [H/dp, A, F/tp], W2
    [F/tp, H/dp] on each device). The block gathers each kernel's H for the call and gives its
    gradient back reduce-scattered to the device's shard: the compiled step all-gathers the shards
    into [H, A, F/tp] and [F/tp, H], reduce-scatters dW1 and dW2 into the shards, and all-reduces
    no weight-sized tensor. Against one device and, unquantized, the float64 reference."""
    recipe = lnmlp.DelayedScaling(amax_history_len=4) if rid == "delayed" else None
    acts = ("silu", "linear")
    d = make(len(acts), np.float32, lead=(B, S), norm="rmsnorm", seed=4, H=H, F=F)
    x2 = np.asarray(d["x"], np.float64).reshape(-1, H)
    block = (x2, d["gamma"], d["beta"], d["k1"], d["b1"], d["k2"], d["b2"], "rmsnorm", False, EPS, acts, {})
    dy = np.cos(np.arange(B * S * H, dtype=np.float64)).reshape(-1, H).astype(np.float32).astype(np.float64)
    g_ref = ref.backward(dy, *block)
    dy = jnp.asarray(dy.reshape(B, S, H), jnp.float32)
    axes = dict(norm_input_axes=("data", None, None), kernel_1_axes=("data", None, "tensor"),
                kernel_2_axes=("tensor", "data"))
    specs = {**_specs(False), "k1": P("data", None, "tensor"), "k2": P("tensor", "data")}
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(kind,) * 2)
    (ym, gm), _, hlo, errs = _one_device_and_mesh(d, "rmsnorm", acts, dy, mesh, specs, {} if explicit else axes,
                                                  recipe)
    tol = ref.TOLERANCE_FP8_SHARDED if recipe is not None else ref.TOLERANCES["float32"]
    assert max(errs.values()) <= tol, errs
    assert gm[3].sharding.spec == specs["k1"] and gm[4].sharding.spec == specs["k2"]
    if recipe is None:
        ref.assert_close("fsdp dk1", np.asarray(gm[3]), g_ref["dw1"].reshape(d["k1"].shape), "float32")
        ref.assert_close("fsdp dk2", np.asarray(gm[4]), g_ref["dw2"], "float32")
    A, Ft = len(acts), F // 2
    found = _collectives(hlo)
    kinds = {op: [t for t, o in found if o == op] for op in ("all-gather", "reduce-scatter", "all-reduce")}
    whole_h = (r"f32\[%d,%d,%d\]" % (H, A, Ft), r"f32\[%d,%d\]" % (Ft, H))
    shard = (r"f32\[%d,%d,%d\]" % (H // 2, A, Ft), r"f32\[%d,%d\]" % (Ft, H // 2))
    has = lambda ts, pattern: any(re.match(pattern, t) for t in ts)  # noqa: E731
    for w in whole_h:
        assert has(kinds["all-gather"], w), f"no all-gather into {w}: {found}"
        assert not has(kinds["all-reduce"], w), f"a weight-sized all-reduce {w}: {found}"
    for w in shard:
        assert has(kinds["reduce-scatter"], w), f"no reduce-scatter into the shard {w}: {found}"
    counts = ", ".join(f"{len(v)} {k}" for k, v in kinds.items() if v)
    ref.MESH_REPORT.append(f"2x2 FSDP {'explicit' if explicit else 'axes':8s} rmsnorm silu+linear float32 "
                           f"{rid:8s} max error {max(errs.values()):.1e} HLO: {counts}")


@pytest.mark.parametrize("policy", ["nothing_saveable", "save_ffn1"])
def test_checkpoint_policies_on_a_mesh(policy):
    """jax.checkpoint around a split block: recomputed or kept, the gradients are the one-device ones."""
    pol = (jax.checkpoint_policies.nothing_saveable if policy == "nothing_saveable"
           else jax.checkpoint_policies.save_only_these_names("ffn1"))
    d = make(1, np.float32, lead=(B, S), seed=1, H=H, F=F)

    def loss(x, k1, k2, axes, remat):
        def block(x, k1, k2):
            return lj.layernorm_mlp(x, d["gamma"], d["beta"], [k1, k2], [d["b1"], d["b2"]], "layernorm", **axes)
        return jnp.sum(jnp.sin(jax.checkpoint(block, policy=pol)(x, k1, k2) if remat else block(x, k1, k2)))

    want = jax.grad(loss, argnums=(0, 1, 2))(d["x"], d["k1"], d["k2"], {}, False)
    mesh, specs = _mesh(2, 2), _specs(True)
    placed = [jax.device_put(d[n], NamedSharding(mesh, specs[n])) for n in ("x", "k1", "k2")]
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(lambda *a: loss(*a, _axes(True), True), argnums=(0, 1, 2)))(*placed)
    for a, b in zip(got, want):
        assert _max_err(a, b) <= ref.TOLERANCES["float32"]


def test_vmap_of_a_split_call():
    d = make(1, np.float32, lead=(B, S), seed=1, H=H, F=F)
    mesh, specs = _mesh(2, 2), _specs(False)
    k1, k2 = (jax.device_put(d[n], NamedSharding(mesh, specs[n])) for n in ("k1", "k2"))
    xs = jnp.stack([d["x"], 2 * d["x"]])
    with jax.set_mesh(mesh):
        ys = jax.jit(jax.vmap(lambda x: lj.layernorm_mlp(x, d["gamma"], d["beta"], [k1, k2], [d["b1"], d["b2"]],
                                                         "layernorm", **_axes(False))))(xs)
    for i in range(2):
        want = lj.layernorm_mlp(xs[i], d["gamma"], d["beta"], [d["k1"], d["k2"]], [d["b1"], d["b2"]], "layernorm")
        assert _max_err(ys[i], want) <= ref.TOLERANCES["float32"]
