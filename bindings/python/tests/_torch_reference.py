"""An unfused PyTorch LayerNorm + MLP with TransformerEngine's parameter names, shapes and layout:
the independent reference that lnmlp.torch.LayerNormMLP is trained against (optimizers,
distributed wrappers, checkpoints). Plain torch.nn.functional ops, autograd's gradients."""

import torch
import torch.nn.functional as tf

# TE's activation -> (the first half's function, whether a linear half multiplies it).
_ACTIVATIONS = {"gelu": (lambda a: tf.gelu(a, approximate="tanh"), False), "relu": (tf.relu, False),
                "swiglu": (tf.silu, True), "geglu": (lambda a: tf.gelu(a, approximate="tanh"), True)}


class TorchLayerNormMLP(torch.nn.Module):
    """fc2(act(fc1(LayerNorm(x)))): fc1_weight [A*F, H], fc2_weight [H, F], as TE and lnmlp.torch."""

    def __init__(self, hidden, ffn, activation="swiglu", eps=1e-5, dtype=torch.float32):
        super().__init__()
        self.act, self.gated = _ACTIVATIONS[activation]
        self.eps, self.ffn = eps, ffn
        width = 2 * ffn if self.gated else ffn
        kw = dict(dtype=dtype)
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(hidden, **kw))
        self.layer_norm_bias = torch.nn.Parameter(torch.zeros(hidden, **kw))
        self.fc1_weight = torch.nn.Parameter(torch.empty(width, hidden, **kw))
        self.fc1_bias = torch.nn.Parameter(torch.zeros(width, **kw))
        self.fc2_weight = torch.nn.Parameter(torch.empty(hidden, ffn, **kw))
        self.fc2_bias = torch.nn.Parameter(torch.zeros(hidden, **kw))

    def forward(self, x):
        h = tf.layer_norm(x, x.shape[-1:], self.layer_norm_weight, self.layer_norm_bias, self.eps)
        a = tf.linear(h, self.fc1_weight, self.fc1_bias)
        a = self.act(a[..., :self.ffn]) * a[..., self.ffn:] if self.gated else self.act(a)
        return tf.linear(a, self.fc2_weight, self.fc2_bias)


def random_state(module, seed, scale=0.3):
    """Random values for every parameter of `module` (float32, CPU), as a state_dict to load."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) * scale for n, p in module.named_parameters()}


class Residual(torch.nn.Module):
    """x + block(x) for each block in turn: a stack of FFN sublayers as a transformer has them."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x
