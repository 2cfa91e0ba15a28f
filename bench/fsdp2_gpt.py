"""PyTorch FSDP2 on the GPT example's model: the peer `gpt --fully-sharded` is measured against.

The model is examples/gpt/model.cpp's, layer for layer (learned positions, pre-norm blocks of
LayerNorm, causal SDPA attention and a tanh-GELU MLP, all Linear layers with biases, the head tied
to the token embedding, cross-entropy in float32), so both do the same FLOPs per token. As FSDP2 is
used: `fully_shard` on each block and on the root, fp32 parameters with bf16 compute and
all-gathers (MixedPrecisionPolicy param_dtype=bf16), gradients reduce-scattered in fp32 (or bf16
with --reduce-dtype bf16), `torch.optim.AdamW(fused=True)`, each block's activations recomputed in
backward (torch.utils.checkpoint, as --checkpoint-activations). Tokens are random bytes: speed and
memory do not depend on them.

    torchrun --nproc-per-node 2 bench/fsdp2_gpt.py --width 4096 --heads 32 --layers 24 --batch 4

Prints one line per rank: ms/step (median of the timed steps), tokens/s over the whole job (global
batch x context / step time), peak allocated and reserved bytes of this rank's GPU.
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def body(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        heads = lambda t: t.view(B, T, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        r = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return r + self.fc_proj(F.gelu(self.fc(self.ln2(r)), approximate="tanh"))

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False) if self.training else self.body(x)


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, width, heads):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(vocab, width))
        self.wpe = nn.Parameter(torch.empty(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(width)

    def forward(self, idx):
        x = F.embedding(idx, self.wte) + self.wpe[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return F.linear(self.lnf(x), self.wte)  # tied head


def init_shards(model, layers):
    """model.cpp's initialization (GPT-2's), each rank drawing its own shards (plain tensors: the whole)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("bias"):
                local.zero_()
            elif ".ln" in name or name.startswith("lnf"):
                local.fill_(1.0)
            elif name == "wpe":
                local.normal_(0.0, 0.01)
            elif name.endswith("proj.weight"):  # residual projections scaled by 1/sqrt(2 * layers)
                local.normal_(0.0, 0.02 / math.sqrt(2 * layers))
            else:
                local.normal_(0.0, 0.02)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    ap.add_argument("--steps", type=int, default=12, help="timed steps, after --warmup")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reduce-dtype", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()  # without a GPU: Gloo on the CPU, a check that the script runs
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(1234)
    with torch.device("meta"):
        model = GPT(args.vocab, args.context, args.layers, args.width, args.heads)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                              reduce_dtype=torch.float32 if args.reduce_dtype == "fp32" else torch.bfloat16)
    for b in model.blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=dev)
    init_shards(model, args.layers)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=cuda)
    gen = torch.Generator(device=dev).manual_seed(rank)

    def step():
        idx = torch.randint(0, args.vocab, (args.batch, args.context + 1), device=dev, generator=gen)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t)
    ms = 1e3 * statistics.median(times)
    tokens = world * args.batch * args.context / (ms / 1e3)
    gib = 2.0 ** 30
    peak = torch.cuda.max_memory_allocated() / gib if cuda else 0.0
    reserved = torch.cuda.max_memory_reserved() / gib if cuda else 0.0
    print(f"fsdp2 rank {rank}/{world}: {params / 1e9:.3f}B parameters, batch {args.batch} x {args.context} per rank, "
          f"reduce {args.reduce_dtype}: {ms:.1f} ms/step (median of {args.steps}), {tokens:.0f} tokens/s, "
          f"peak allocated {peak:.2f} GiB, reserved {reserved:.2f} GiB, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
