"""lnmlp.jax split over a device mesh: the Flax module LayerNormMLP trained on a (data x tensor)
mesh, with data, tensor and (with --sp) sequence parallelism, against the same steps on one
device (docs/jax-mesh.md).

Without GPUs it makes 8 CPU devices (XLA_FLAGS, before jax is imported). From a checkout:

    PYTHONPATH=bindings/python LNMLP_LIBRARY=build/release/src/liblnmlp.so \\
        python3 examples/jax/mesh.py --data 2 --tensor 4 --sp

prints the loss of each step on the mesh and on one device, the largest difference of the
trained parameters, and the collectives XLA compiled into the step.
"""

import argparse
import os
import re

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from lnmlp.jax.flax import LayerNormMLP  # noqa: E402


def train(model, variables, x, target, steps, lr=0.05):
    """`steps` jitted SGD steps on the mean squared error; the losses, the variables, the HLO."""

    @jax.jit
    def step(variables, x, target):
        def loss(v):
            y, _ = model.apply(v, x)
            return jnp.mean((y - target) ** 2)

        value, grads = jax.value_and_grad(loss)(variables)
        return jax.tree.map(lambda p, g: p - lr * g, variables, grads), value

    losses = []
    for _ in range(steps):
        variables, value = step(variables, x, target)
        losses.append(float(value))
    return losses, variables, step.lower(variables, x, target).compile().as_text()


def main(data=2, tensor=4, sp=False, steps=10, batch=8, seq=64, hidden=128, ffn=512):
    mesh = jax.make_mesh((data, tensor), ("data", "tensor"))
    # flax's logical axis rules: TransformerEngine's module names its kernels' axes
    # ("embed", "act", "mlp") and ("mlp", "embed"); "mlp" -> the tensor axis makes W1
    # column-parallel and W2 row-parallel, "batch" -> the data axis splits x's batch, and "seq"
    # -> the tensor axis (--sp) splits x's sequence over the tensor group too.
    rules = (("batch", "data"), ("seq", "tensor" if sp else None), ("embed", None), ("act", None), ("mlp", "tensor"))
    model = LayerNormMLP(intermediate_dim=ffn, activations=("gelu", "linear"), use_bias=True,
                         layernorm_input_axes=("batch", "seq", "embed"))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, seq, hidden)), jnp.float32)
    target = jnp.sin(x @ jnp.asarray(rng.standard_normal((hidden, hidden)) / np.sqrt(hidden), jnp.float32))
    boxed = model.init(jax.random.key(0), x)

    one_losses, one, _ = train(model, nn.unbox(boxed), x, target, steps)

    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    variables = jax.device_put(nn.unbox(boxed), shardings)
    x_sharding = NamedSharding(mesh, P("data", "tensor" if sp else None, None))
    x_placed, target_placed = jax.device_put(x, x_sharding), jax.device_put(target, x_sharding)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        losses, trained, hlo = train(model, variables, x_placed, target_placed, steps)

    diff = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
               for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(one)))
    collectives = re.findall(r"\s(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(",
                             hlo)
    return losses, one_losses, diff, {c: collectives.count(c) for c in sorted(set(collectives))}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=int, default=2)
    ap.add_argument("--tensor", type=int, default=4)
    ap.add_argument("--sp", action="store_true", help="sequence parallelism: x's sequence over the tensor axis too")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    losses, one_losses, diff, collectives = main(a.data, a.tensor, a.sp, a.steps)
    print(f"mesh {a.data} (data) x {a.tensor} (tensor){', sequence parallel' if a.sp else ''}; "
          f"{jax.device_count()} {jax.devices()[0].platform} devices")
    print("step  loss (mesh)  loss (one device)")
    for i, (l, o) in enumerate(zip(losses, one_losses)):
        print(f"{i:4d}  {l:.6f}     {o:.6f}")
    print(f"trained parameters, largest difference from one device: {diff:.1e} (relative to each tensor's max)")
    print("collectives in the compiled step:", ", ".join(f"{n} {c}" for c, n in collectives.items()))
