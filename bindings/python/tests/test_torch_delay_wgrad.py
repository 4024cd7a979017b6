"""lnmlp.torch.LayerNormMLP(delay_wgrad_compute=True) and backward_dw(), as TransformerEngine's
(module/layernorm_mlp.py, module/base.py, module/_common.py's WeightGradStore): backward gives
the input's, the norm's and the biases' gradients and leaves the weights' to backward_dw(), one
per backward, oldest first; backward_dw sets the weights' .grad (or, under
fuse_wgrad_accumulation, accumulates into main_grad) and runs the registered hooks. Through the
library's backward in two calls, whose two calls give one backward's bits."""

import copy

import pytest

from _requirements import torch_or_skip  # noqa: E402

torch = torch_or_skip()

import _reference as ref  # noqa: E402
import lnmlp  # noqa: E402
import lnmlp.torch as lt  # noqa: E402
from _torch_reference import random_state  # noqa: E402

H, F = 32, 48
PARAMS = ("layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")
RECIPES = {
    "none": None,
    "delayed": lnmlp.DelayedScaling(amax_history_len=4),
    "current": lnmlp.Float8CurrentScaling(),
    "block": lnmlp.Float8BlockScaling(),
    "mxfp8": lnmlp.MXFP8BlockScaling(),
}


def pair(seed, **kw):
    """A module with delay_wgrad_compute and the same module without, with the same parameters."""
    delayed = lt.LayerNormMLP(H, F, activation="swiglu", delay_wgrad_compute=True, **kw)
    delayed.load_state_dict(random_state(delayed, seed))
    plain = lt.LayerNormMLP(H, F, activation="swiglu", **kw)
    plain.load_state_dict(delayed.state_dict())
    return delayed, plain


def step(m, x, dy, **kw):
    """Forward and backward of one micro-batch; the input's gradient."""
    xi = x.clone().requires_grad_(True)
    (m(xi, **kw) * dy).sum().backward()
    return xi.grad


def reference_weight_grads(m, x, dy):
    """dfc1_weight, dfc2_weight from the float64 reference, in nn.Linear's layout."""
    n = lambda t: t.detach().double().numpy()  # noqa: E731
    args = (n(x), n(m.layer_norm_weight), n(m.layer_norm_bias), n(m.fc1_weight).T.reshape(H, 2, F),
            n(m.fc1_bias).reshape(2, F), n(m.fc2_weight).T, n(m.fc2_bias), "layernorm", False, 1e-5,
            ("silu", "linear"), {})
    g = ref.backward(n(dy), *args)
    return g["dw1"].reshape(H, 2 * F).T, g["dw2"].T


@pytest.mark.parametrize("checkpoint", [False, True], ids=["save_all", "checkpoint"])
@pytest.mark.parametrize("rid", list(RECIPES))
def test_backward_dw_gives_the_weight_gradients_of_one_backward(rid, checkpoint):
    torch.manual_seed(3)
    delayed, plain = pair(4, fp8_recipe=RECIPES[rid], checkpoint=checkpoint)
    assert delayed.need_backward_dw() and not plain.need_backward_dw()
    assert all(getattr(delayed, n).skip_backward_post_hook for n in ("fc1_weight", "fc1_bias", "fc2_weight"))
    x, dy = torch.randn(40, H), torch.randn(40, H)
    dx = step(delayed, x, dy)
    assert delayed.fc1_weight.grad is None and delayed.fc2_weight.grad is None
    for n in ("layer_norm_weight", "layer_norm_bias", "fc1_bias", "fc2_bias"):
        assert getattr(delayed, n).grad is not None, n  # backward gives these, as TE's does here
    delayed.backward_dw()
    # The bits of one backward: every gradient, and the delayed-scaling state.
    assert torch.equal(dx, step(plain, x, dy))
    for n in PARAMS:
        assert torch.equal(getattr(delayed, n).grad, getattr(plain, n).grad), n
    if delayed.fp8_state is not None:
        assert torch.equal(delayed.fp8_state, plain.fp8_state)
    if rid == "none":  # and the float64 reference's weight gradients
        dw1, dw2 = reference_weight_grads(delayed, x, dy)
        ref.assert_close("delayed dfc1_weight", delayed.fc1_weight.grad.numpy(), dw1, "float32")
        ref.assert_close("delayed dfc2_weight", delayed.fc2_weight.grad.numpy(), dw2, "float32")


def test_backward_dw_finishes_the_oldest_backward_first_and_sets_grad_as_te_does():
    """A pipeline schedule runs several backwards, then their backward_dw()s, in order; each sets
    .grad to its own backward's weight gradients (TE assigns .grad: it does not add)."""
    torch.manual_seed(5)
    delayed, plain = pair(6)
    xs, dys = [torch.randn(24, H) for _ in range(2)], [torch.randn(24, H) for _ in range(2)]
    for x, dy in zip(xs, dys):
        step(delayed, x, dy)
    assert lt._ops.pending_weight_grads(delayed._cfg.slot) == 2
    for x, dy in zip(xs, dys):
        delayed.backward_dw()
        plain.zero_grad(set_to_none=True)
        step(plain, x, dy)
        assert torch.equal(delayed.fc1_weight.grad, plain.fc1_weight.grad)
        assert torch.equal(delayed.fc2_weight.grad, plain.fc2_weight.grad)
    assert lt._ops.pending_weight_grads(delayed._cfg.slot) == 0
    with pytest.raises(lnmlp.InvalidArgumentError, match="no backward is waiting"):
        delayed.backward_dw()
    plain.backward_dw()  # a module without delay_wgrad_compute: nothing to do


def test_backward_dw_with_fuse_wgrad_accumulation_accumulates_into_main_grad():
    """TE's delayed wgrad GEMM accumulates into main_grad (writes on is_first_microbatch=True), and
    backward returns Megatron's placeholder .grad where grad_added_to_main_grad asks for one."""
    torch.manual_seed(7)
    delayed, plain = pair(8, fuse_wgrad_accumulation=True)
    delayed.fc2_weight.grad_added_to_main_grad = False
    plain.fc2_weight.grad_added_to_main_grad = False
    xs, dys = [torch.randn(16, H) for _ in range(3)], [torch.randn(16, H) for _ in range(3)]
    for i, (x, dy) in enumerate(zip(xs, dys)):
        step(delayed, x, dy, is_first_microbatch=(i == 0))
        step(plain, x, dy, is_first_microbatch=(i == 0))
        delayed.backward_dw()
    for n in ("fc1_weight", "fc2_weight"):
        assert torch.equal(getattr(delayed, n).main_grad, getattr(plain, n).main_grad), n
    assert delayed.fc1_weight.grad is None
    assert delayed.fc2_weight.grad is not None and delayed.fc2_weight.grad_added_to_main_grad
    for n in ("fc1_bias", "fc2_bias", "layer_norm_weight"):
        assert torch.equal(getattr(delayed, n).grad, getattr(plain, n).grad), n


def test_backward_dw_runs_the_registered_hooks_after_setting_the_gradients():
    torch.manual_seed(9)
    delayed, _ = pair(10)
    seen = []
    delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: seen.append(delayed.fc1_weight.grad is not None))
    step(delayed, torch.randn(8, H), torch.randn(8, H))
    assert seen == []
    delayed.backward_dw()
    assert seen == [True]


def test_a_copied_module_has_its_own_pending_weight_gradients():
    torch.manual_seed(11)
    delayed, _ = pair(12)
    step(delayed, torch.randn(8, H), torch.randn(8, H))
    c = copy.deepcopy(delayed)
    assert c.need_backward_dw() and lt._ops.pending_weight_grads(c._cfg.slot) == 0
    with pytest.raises(lnmlp.InvalidArgumentError, match="no backward is waiting"):
        c.backward_dw()
    delayed.backward_dw()


def test_under_torch_compile_delay_wgrad_compute_is_refused_at_backward():
    torch.manual_seed(13)
    delayed, _ = pair(14)
    compiled = torch.compile(delayed, backend="aot_eager")
    x = torch.randn(8, H, requires_grad=True)
    with pytest.raises(Exception, match="delay_wgrad_compute=True does not run under torch.compile"):
        compiled(x).sum().backward()


def test_the_deferred_buffer_is_what_the_library_reports():
    """Plan.deferred_bytes (lnmlp_plan_get_deferred_bytes), worked out from the shapes: fp32 saving
    everything keeps dh [T, 2F]; current scaling the scales and dy's and dh's codes."""
    kw = dict(hidden=H, ffn=F, activation_type=("silu", "linear"))
    with lnmlp.Plan(40, **kw) as p32, lnmlp.Plan(40, recipe=lnmlp.Float8CurrentScaling(), **kw) as p8:
        full, fp8 = p32.deferred_bytes(), p8.deferred_bytes()
        assert full == p32.deferred_bytes(40) > p32.deferred_bytes(8) > p32.deferred_bytes(0) == 0
        assert full == -(-40 * 2 * F * 4 // 256) * 256
        assert fp8 == 256 + -(-40 * H // 256) * 256 + -(-40 * 2 * F // 256) * 256
    with lnmlp.Plan(40, remat="forward_only", **kw) as inference:
        assert inference.deferred_bytes() == 0
    with pytest.raises(lnmlp.InvalidArgumentError):
        p = lnmlp.Plan(4, **kw)
        try:
            p.deferred_bytes(5)
        finally:
            p.close()
