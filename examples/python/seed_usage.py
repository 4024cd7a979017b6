"""The usage example of TransformerEngine's layernorm_mlp (the project's seed), run on NumPy
arrays through lnmlp, then the gradients through layernorm_mlp_vjp.

    python3 examples/python/seed_usage.py
"""
import numpy as np

from lnmlp import layernorm_mlp, layernorm_mlp_vjp

batch, seq, hidden, ffn = 2, 128, 256, 1024
rng = np.random.default_rng(0)
input_tensor = rng.standard_normal((batch, seq, hidden), dtype=np.float32)
ln_scale = np.ones(hidden, np.float32)
ln_bias = np.zeros(hidden, np.float32)
ffn1_weight = (rng.standard_normal((hidden, 1, ffn)) / np.sqrt(hidden)).astype(np.float32)
ffn2_weight = (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(np.float32)
ffn1_bias = np.zeros((1, ffn), np.float32)
ffn2_bias = np.zeros(hidden, np.float32)

# Fused LayerNorm + MLP forward pass with GELU activation
output = layernorm_mlp(
    x=input_tensor,
    gamma=ln_scale,
    beta=ln_bias,
    kernels=[ffn1_weight, ffn2_weight],
    biases=[ffn1_bias, ffn2_bias],
    norm_type="layernorm",
    activation_type=("gelu",),
)
print("output", output.shape, output.dtype, f"mean {output.mean():+.4f} std {output.std():.4f}")

output, vjp = layernorm_mlp_vjp(input_tensor, ln_scale, ln_bias, [ffn1_weight, ffn2_weight],
                                [ffn1_bias, ffn2_bias], "layernorm", activation_type=("gelu",))
dx, dgamma, dbeta, (dkernel_1, dkernel_2), (dbias_1, dbias_2) = vjp(np.ones_like(output))
print("dx", dx.shape, "dkernel_1", dkernel_1.shape, "dkernel_2", dkernel_2.shape, "dbias_1", dbias_1.shape)
