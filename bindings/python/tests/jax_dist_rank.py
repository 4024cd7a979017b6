"""One process of test_jax_distributed.py: `python jax_dist_rank.py RANK WORLD PORT OUT_DIR`.

It joins a jax.distributed group of WORLD processes (coordinator on 127.0.0.1:PORT, gloo
collectives between the processes' CPU devices), each process with 2 CPU devices, and for each
configuration of CONFIGS runs jitted value-and-grad steps of lnmlp.jax.layernorm_mlp over a
global mesh of all the devices, then the same steps on its own first device alone. It writes
OUT_DIR/<configuration>-rank<RANK>.npz: y and every gradient of the last mesh step gathered from
every process (process_allgather), the one-device step's, and under delayed scaling every local
device's copy of the state the mesh steps left."""

import os
import sys

import numpy as np

LOCAL_DEVICES = 2
B, S, H, F = 4, 16, 64, 128
NAMES = ("x", "gamma", "beta", "k1", "k2", "b1", "b2")

# name -> (mesh (data, tensor), sequence parallel, FSDP kernels, dtype, recipe, activations, steps)
CONFIGS = {
    "tp_sp_2x2_f32": ((2, 2), True, False, "float32", None, ("silu", "linear"), 1),
    "tp_sp_1x4_bf16": ((1, 4), True, False, "bfloat16", None, ("gelu",), 1),
    "delayed_sp_2x2_bf16": ((2, 2), True, False, "bfloat16", "delayed", ("silu", "linear"), 3),
    "current_sp_2x2_bf16": ((2, 2), True, False, "bfloat16", "current", ("silu", "linear"), 1),
    "fsdp_tp_2x2_f32": ((2, 2), False, True, "float32", None, ("silu", "linear"), 1),
}


def inputs(name):
    """The configuration's tensors (NumPy, in its dtype) and dy = cos(index) in float32, the same
    in every process (and in the test, for the float64 reference)."""
    import _block_cases
    import _reference as ref

    _, _, _, dtype_name, _, acts, _ = CONFIGS[name]
    dtype = ref.DTYPES[dtype_name]
    d = _block_cases.make(len(acts), dtype, lead=(B, S), norm="rmsnorm", seed=17, H=H, F=F)
    dy = np.cos(np.arange(B * S * H, dtype=np.float64)).reshape(B, S, H).astype(dtype).astype(np.float32)
    return d, dy


def specs_and_axes(name):
    from jax.sharding import PartitionSpec as P

    _, sp, fsdp, _, _, _, _ = CONFIGS[name]
    h = "data" if fsdp else None
    specs = dict(x=P("data", "tensor" if sp else None, None), gamma=P(), beta=P(), k1=P(h, None, "tensor"),
                 k2=P("tensor", h), b1=P(None, "tensor"), b2=P())
    axes = dict(norm_input_axes=("data", "tensor" if sp else None, None), kernel_1_axes=(h, None, "tensor"),
                kernel_2_axes=("tensor", h))
    return specs, axes


def step_fn(name, axes, recipe):
    import jax
    import jax.numpy as jnp
    import lnmlp.jax as lj

    acts = CONFIGS[name][5]

    def loss(x, gamma, beta, k1, k2, b1, b2, qs, dy):
        y = lj.layernorm_mlp(x, gamma, beta, [k1, k2], [b1, b2], "rmsnorm", epsilon=1e-5, activation_type=acts,
                             quantizer_set=qs, **axes)
        return jnp.sum(y.astype(jnp.float32) * dy), y

    argnums = tuple(range(8 if recipe is not None and recipe.stateful else 7))
    return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))


def run(name, rank):
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    import lnmlp.jax as lj

    mesh_shape, _, _, _, rid, _, steps = CONFIGS[name]
    d, dy_np = inputs(name)
    recipe = {None: None, "delayed": lj.DelayedScaling(amax_history_len=3), "current": lj.Float8CurrentScaling()}[rid]
    specs, axes = specs_and_axes(name)
    mesh = jax.make_mesh(mesh_shape, ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    place = lambda a, spec: jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec),  # noqa: E731
                                                         lambda index: a[index])
    args = [None if d[n] is None else place(d[n], specs[n]) for n in NAMES]
    dy = place(dy_np, specs["x"])
    qs = lj.make_quantizer_set(recipe) if recipe is not None else None
    with jax.set_mesh(mesh):
        step = step_fn(name, axes, recipe)
        for _ in range(steps):
            (_, y), grads = step(*args, qs, dy)
            if recipe is not None and recipe.stateful:
                qs = grads[7]
    out = {"y": multihost_utils.process_allgather(y, tiled=True)}
    for n, g in zip(NAMES, grads):
        if g is not None:
            out["d" + n] = multihost_utils.process_allgather(g, tiled=True)
    if recipe is not None and recipe.stateful:
        out["states"] = np.stack([np.asarray(s.data) for s in qs.state.addressable_shards])
    # The same steps on this process's first device alone.
    local = jax.local_devices()[0]
    one = [None if d[n] is None else jax.device_put(d[n], local) for n in NAMES]
    dy1 = jax.device_put(jnp.asarray(dy_np), local)
    qs1 = lj.make_quantizer_set(recipe) if recipe is not None else None
    step1 = step_fn(name, {}, recipe)
    for _ in range(steps):
        (_, y1), g1 = step1(*one, qs1, dy1)
        if recipe is not None and recipe.stateful:
            qs1 = g1[7]
    out["one_y"] = np.asarray(y1)
    for n, g in zip(NAMES, g1):
        if g is not None:
            out["one_d" + n] = np.asarray(g)
    if recipe is not None and recipe.stateful:
        out["one_state"] = np.asarray(qs1.state)
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def main():
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES}"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=world, process_id=rank)
    assert jax.device_count() == world * LOCAL_DEVICES and jax.local_device_count() == LOCAL_DEVICES
    for name in CONFIGS:
        np.savez(os.path.join(out_dir, f"{name}-rank{rank}.npz"), **run(name, rank))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
