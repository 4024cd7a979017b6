"""A HuggingFace Llama whose feed-forward sublayers run on lnmlp with tensor parallelism, trained
beside the unmodified model.

Builds a small LlamaForCausalLM from a LlamaConfig (random weights: nothing is downloaded), then
a copy in which every decoder layer's post-attention RMSNorm + SwiGLU MLP is one
lnmlp.torch.LayerNormMLP(normalization="RMSNorm", activation="swiglu", bias=False) split over
the ranks as TransformerEngine and Megatron split it (tp_group, set_parallel_mode=True): each rank
holds its rows of gate_proj and up_proj (fc1_weight, gate first: swiglu's activated half) and its
columns of down_proj (fc2_weight); attention, embeddings and the head stay whole on every rank.
Both models train with AdamW from the same weights on the same batches (causal LM loss on
sequences that count up mod the vocabulary in steps of 1 to 4, so the loss can fall), in float32,
on WORLD gloo CPU processes; rank 0 prints both losses per step and their largest relative
difference, and the script fails if that exceeds --tolerance. The two differ by the order of fp32
sums only (lnmlp's GEMM2 partial sums over the ranks, its fused norm), which AdamW's per-element
normalisation lets grow as training goes: about 1e-7 at first, 1e-4 after a few dozen steps.

    PYTHONPATH=bindings/python python3 examples/torch/llama_tp.py [--steps 20] [--world 2] [--tolerance 1e-3]
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN, FFN, LAYERS, HEADS, VOCAB = 128, 256, 2, 4, 512
BATCH, SEQ, LR = 4, 32, 3e-3


def batch(generator):
    """[BATCH, SEQ] tokens: each row counts up from a random start in a random step of 1 to 4."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    stride = torch.randint(1, 5, (BATCH, 1), generator=generator)
    return (start + stride * torch.arange(SEQ)) % VOCAB


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=SEQ,
                         attn_implementation="eager")
    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(config).float()


def swap_in_lnmlp(model, group):
    """Each decoder layer's post-attention RMSNorm + MLP -> one tensor-parallel LayerNormMLP holding
    this rank's shards of the layer's weights."""
    import lnmlp.torch as lt
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    f = FFN // world
    rows = slice(rank * f, (rank + 1) * f)
    for layer in model.model.layers:
        norm, mlp = layer.post_attention_layernorm, layer.mlp
        block = lt.LayerNormMLP(HIDDEN, FFN, eps=norm.variance_epsilon, bias=False, normalization="RMSNorm",
                                activation="swiglu", tp_group=group, set_parallel_mode=True, device="cpu")
        with torch.no_grad():
            block.layer_norm_weight.copy_(norm.weight)
            block.fc1_weight.copy_(torch.cat([mlp.gate_proj.weight[rows], mlp.up_proj.weight[rows]]))
            block.fc2_weight.copy_(mlp.down_proj.weight[:, rows])
        layer.post_attention_layernorm = torch.nn.Identity()
        layer.mlp = block
    return model


def train(rank, world, port, steps, tolerance, failed):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    reference = llama()
    model = swap_in_lnmlp(copy.deepcopy(reference), dist.group.WORLD)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (reference, model)]
    data = torch.Generator().manual_seed(1)  # the same batches on every rank
    worst = 0.0
    if rank == 0:
        print(f"Llama: {LAYERS} layers, hidden {HIDDEN}, ffn {FFN}; lnmlp's feed-forward split over {world} ranks")
        print(f"{'step':>4}  {'unmodified':>12}  {'lnmlp TP':>12}  {'rel. diff':>10}")
    for step in range(steps):
        tokens = batch(data)
        losses = []
        for m, opt in zip((reference, model), optimizers):
            opt.zero_grad()
            loss = m(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        diff = abs(losses[1] - losses[0]) / abs(losses[0])
        worst = max(worst, diff)
        if rank == 0:
            print(f"{step:>4}  {losses[0]:>12.6f}  {losses[1]:>12.6f}  {diff:>10.2e}")
    if rank == 0:
        print(f"largest relative loss difference over {steps} steps: {worst:.2e} (tolerance {tolerance:.0e})")
    if worst > tolerance:
        failed.value = 1
    # Every collective finished before the group goes: a gloo worker still finishing one during the
    # interpreter's teardown would take the GIL of a finalizing interpreter and abort the process.
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failed = mp.get_context("spawn").Value("i", 0)
    mp.spawn(train, args=(args.world, port, args.steps, args.tolerance, failed), nprocs=args.world)
    sys.exit(failed.value)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
