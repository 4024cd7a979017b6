"""What a test module needs imported, or the module skipped without it."""

import os

import pytest


def torch_or_skip(distributed=False):
    """torch, or the calling test module skipped where it is not installed -- except under
    LNMLP_REQUIRE_TORCH=1 (the README's test command), where a missing torch fails instead of
    skipping silently. With ``distributed``, also skipped where torch has no torch.distributed."""
    if os.environ.get("LNMLP_REQUIRE_TORCH") == "1":
        import torch
    else:
        torch = pytest.importorskip("torch")
    if distributed and not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed", allow_module_level=True)
    return torch
