"""lnmlp.torch.LayerNormMLP with the single-process clients of its parameters: its output is not a
view, safetensors saves and loads it, Megatron-style main_grad views into one flat fp32 buffer
take fuse_wgrad_accumulation's sums, and fused and foreach AdamW train it as they train the
unfused float64 PyTorch reference (_torch_reference.py). The multi-process clients (FSDP2, DDP,
torch.distributed.checkpoint) are in test_torch_distributed.py."""

import os

import numpy as np
import pytest

import _reference as ref

if os.environ.get("LNMLP_REQUIRE_TORCH") == "1":  # the README's test command: never skip silently
    import torch
    import safetensors.torch as st
else:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")

import lnmlp  # noqa: E402
import lnmlp.torch as lt  # noqa: E402
from _torch_reference import TorchLayerNormMLP, random_state  # noqa: E402

H, F = 24, 40


def numpy(t):
    return t.detach().double().cpu().numpy()


def pair(activation="swiglu", seed=1, **kw):
    """An lnmlp module and the float64 reference, with the same random parameters."""
    m = lt.LayerNormMLP(H, F, activation=activation, **kw)
    r = TorchLayerNormMLP(H, F, activation=activation, dtype=torch.float64)
    state = random_state(m, seed)
    m.load_state_dict(state)
    r.load_state_dict({n: t.double() for n, t in state.items()})
    return m, r


def test_parameters_are_contiguous_in_te_layout_and_the_output_owns_its_storage():
    m, _ = pair()
    for n, p in m.named_parameters():
        assert p.is_contiguous(), f"{n} is not contiguous"
    assert m.fc1_weight.shape == (2 * F, H) and m.fc2_weight.shape == (H, F)
    x = torch.randn(3, 5, H, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape and y._base is None, "forward returned a view"
    assert y.is_contiguous()
    y.sum().backward()
    assert m.fc1_weight.grad.shape == m.fc1_weight.shape and m.fc1_weight.grad.is_contiguous()
    assert x.grad._base is None


def test_safetensors_saves_and_loads_the_module(tmp_path):
    m, r = pair(seed=2)
    path = str(tmp_path / "block.safetensors")
    st.save_file(m.state_dict(), path)
    loaded = st.load_file(path)
    # The parameters, and TE's _extra_state (empty without delayed-scaling state), as a TE module saves.
    assert set(loaded) == {n for n, _ in m.named_parameters()} | {"_extra_state"}
    assert loaded["_extra_state"].dtype == torch.uint8 and loaded["_extra_state"].numel() == 0
    for n, p in m.named_parameters():
        assert torch.equal(loaded[n], p.detach()), n
    m2 = lt.LayerNormMLP(H, F, activation="swiglu")
    m2.load_state_dict(loaded, strict=True)
    x = torch.randn(7, H)
    assert torch.equal(m2(x), m(x))
    ref.assert_close("safetensors-loaded y", numpy(m2(x)), numpy(r(x.double())), "float32")


def test_megatron_main_grad_views_into_one_flat_buffer_take_the_accumulated_gradients():
    m, r = pair(seed=3, fuse_wgrad_accumulation=True)
    # Megatron-core's layout: one flat fp32 buffer, each parameter's main_grad a view of its slice,
    # with other parameters' slices around them (here a sentinel that must stay as it is).
    sentinel = 12345.0
    weights = [m.fc1_weight, m.fc2_weight]
    sizes = [w.numel() for w in weights]
    flat = torch.full((sum(sizes) + 3 * 8,), sentinel, dtype=torch.float32)
    start = 8
    for w, n in zip(weights, sizes):
        w.main_grad = flat[start:start + n].view(w.shape)
        w.main_grad.zero_()
        start += n + 8
    xs = [torch.randn(9, H) for _ in range(3)]
    for i, x in enumerate(xs):
        m(x, is_first_microbatch=(i == 0)).square().sum().backward()
        r(x.double()).square().sum().backward()
    assert m.fc1_weight.grad is None and m.fc2_weight.grad is None, "fused accumulation returns no .grad"
    ref.assert_close("main_grad fc1", numpy(m.fc1_weight.main_grad), numpy(r.fc1_weight.grad), "float32")
    ref.assert_close("main_grad fc2", numpy(m.fc2_weight.main_grad), numpy(r.fc2_weight.grad), "float32")
    ref.assert_close("fc1_bias.grad", numpy(m.fc1_bias.grad), numpy(r.fc1_bias.grad), "float32")
    gaps = torch.cat([flat[:8], flat[8 + sizes[0]:16 + sizes[0]], flat[-8:]])
    assert torch.all(gaps == sentinel), "the accumulation wrote outside its slices"
    # Megatron zeroes the whole buffer between steps; the views keep working.
    flat.zero_()
    r.zero_grad()
    m(xs[0]).square().sum().backward()
    r(xs[0].double()).square().sum().backward()
    ref.assert_close("main_grad fc2 after zeroing", numpy(m.fc2_weight.main_grad), numpy(r.fc2_weight.grad),
                     "float32")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_main_grad_is_overwritten_and_accumulated_as_transformer_engine_does(compiled):
    """TE's LayerNormMLP backward (module/layernorm_mlp.py): with fuse_wgrad_accumulation the wgrad
    GEMM writes main_grad on is_first_microbatch=True or for a weight with overwrite_main_grad, and
    adds into it otherwise; here fc2 overwrites always, fc1 only on the first micro-batch."""
    m, r = pair(seed=5, fuse_wgrad_accumulation=True)
    for w in (m.fc1_weight, m.fc2_weight):
        w.main_grad = torch.full(w.shape, 7.0)  # last step's sums: the first micro-batch replaces them
    m.fc2_weight.overwrite_main_grad = True
    step = torch.compile(m) if compiled else m
    xs = [torch.randn(9, H) for _ in range(3)]
    for i, x in enumerate(xs):
        step(x, is_first_microbatch=(i == 0)).square().sum().backward()
        r(x.double()).square().sum().backward()
    ref.assert_close("main_grad fc1 (sum of 3)", numpy(m.fc1_weight.main_grad), numpy(r.fc1_weight.grad), "float32")
    r.zero_grad()
    r(xs[-1].double()).square().sum().backward()
    ref.assert_close("main_grad fc2 (the last)", numpy(m.fc2_weight.main_grad), numpy(r.fc2_weight.grad), "float32")


def test_megatron_ddp_gets_transformer_engines_placeholder_gradient_and_its_hook_runs():
    """Megatron-core's DDP gives each parameter grad_added_to_main_grad (False) and hooks its
    AccumulateGrad node; TE sets the attribute True and returns a placeholder .grad (zeros with
    zero_out_wgrad), so the hook runs and knows main_grad already holds the sum. Without the
    attribute TE returns no .grad."""
    m, r = pair(seed=6, fuse_wgrad_accumulation=True)
    hooked, grad_accs = [], []
    for name in ("fc1_weight", "fc2_weight"):
        w = getattr(m, name)
        w.grad_added_to_main_grad = False
        acc = w.expand_as(w).grad_fn.next_functions[0][0]  # Megatron's way to reach AccumulateGrad
        acc.register_hook(lambda *_, name=name: hooked.append(name))
        grad_accs.append(acc)  # kept alive, as Megatron keeps them
    m.fc2_weight.zero_out_wgrad = True
    x = torch.randn(7, H)
    m(x).square().sum().backward()
    r(x.double()).square().sum().backward()
    assert sorted(hooked) == ["fc1_weight", "fc2_weight"]
    assert m.fc1_weight.grad_added_to_main_grad and m.fc2_weight.grad_added_to_main_grad
    assert m.fc1_weight.grad.shape == m.fc1_weight.shape and m.fc1_weight.grad.dtype == m.fc1_weight.dtype
    assert torch.equal(m.fc2_weight.grad, torch.zeros_like(m.fc2_weight))
    ref.assert_close("main_grad fc1", numpy(m.fc1_weight.main_grad), numpy(r.fc1_weight.grad), "float32")
    plain, _ = pair(seed=6, fuse_wgrad_accumulation=True)
    plain(x).square().sum().backward()
    assert plain.fc1_weight.grad is None and plain.fc2_weight.grad is None


def test_a_main_grad_in_another_layout_is_refused_with_a_clear_error():
    m, _ = pair(seed=4, fuse_wgrad_accumulation=True)
    m.fc2_weight.main_grad = torch.zeros(F, H).t()  # the right shape, not contiguous
    with pytest.raises(lnmlp.InvalidArgumentError, match="main_grad must be a contiguous float32"):
        m(torch.randn(2, H))


@pytest.mark.parametrize("optimizer", [dict(fused=True), dict(foreach=True)], ids=["fused", "foreach"])
@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_adamw_trains_the_module_as_it_trains_the_torch_reference(optimizer, activation):
    m, r = pair(activation, seed=5)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, **optimizer)
    opt_r = torch.optim.AdamW(r.parameters(), lr=1e-3, weight_decay=0.01, foreach=False)
    g = torch.Generator().manual_seed(6)
    for step in range(4):
        x = torch.randn(2, 8, H, generator=g)
        target = torch.randn(2, 8, H, generator=g)
        for module, o, inp, tgt in ((m, opt, x, target), (r, opt_r, x.double(), target.double())):
            o.zero_grad()
            (module(inp) - tgt).square().mean().backward()
            o.step()
    for (n, p), (_, q) in zip(m.named_parameters(), r.named_parameters()):
        assert p.is_contiguous(), f"{n} lost its layout in the optimizer"
        # Four Adam steps of lr 1e-3 move each parameter by up to ~4e-3; the fp32 gradients' rounding
        # can only change that by a small fraction of a step.
        np.testing.assert_allclose(numpy(p), numpy(q), rtol=0, atol=2e-5, err_msg=n)
