"""The offloading peers of `gpt --offload` on the GPT example's model: torchao's CPUOffloadOptimizer and
DeepSpeed's ZeRO-Offload (ZeRO stage 2, optimizer on the host, DeepSpeedCPUAdam), one GPU, one process.

The model is bench/fsdp2_gpt.py's GPT (examples/gpt/model.cpp's, layer for layer; imported from there),
each block's activations recomputed in backward (torch.utils.checkpoint, as --checkpoint-activations),
cross-entropy in float32, random byte tokens. Each peer as its users would set it up:

  torchao    CPUOffloadOptimizer(params, torch.optim.AdamW, fused=True, offload_gradients=...): it pins a
             host copy of each parameter (tensors under 4096 elements stay on the GPU with their own AdamW)
             in the parameter's own dtype, with a host gradient of that dtype, and torch's fused CPU AdamW
             keeps m and v in that dtype too. --dtype bf16: bf16 weights on the GPU and bf16 weights, m, v
             and gradients on the host, no fp32 master (8 bytes a parameter on the host). --dtype fp32: fp32
             weights on the GPU, compute under bf16 autocast, fp32 copy, m, v, gradients on the host (16).
  deepspeed  deepspeed.initialize with ZeRO stage 2, offload_optimizer {device: cpu, pin_memory: true},
             optimizer AdamW (ZeRO-Offload picks DeepSpeedCPUAdam, its AVX C++ op JIT-built on first use:
             ninja and g++ on the machine), no gradient clipping. --dtype bf16 (bf16 {enabled: true}):
             bf16 weights on the GPU, fp32 master, m, v and gradients on the host (16 bytes a parameter);
             --ds-master bf16-master (bf16_master_weights_and_grads: bf16 master and gradients, fp32 m, v)
             and bf16 (also bf16_optimizer_states: everything bf16) are its lower-precision modes.
             --dtype fp32: no bf16 section, fp32 weights, compute under bf16 autocast.

Ours, for comparison, is `gpt --dtype bf16 --master-weight-bits 24 --offload` (bf16 weights on the GPU,
a 24-bit master and the quantized state on the host).

    PYTHONPATH=/tmp/site python3 bench/offload_peers.py --peer both --width 4096 --heads 32 --layers 8 \\
        --batch 1 --steps 6 --warmup 2

The wheels (torchao, deepspeed and what deepspeed needs that the GPU machine lacks) are carried in .whl
and installed with `python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl`.

Prints one line per peer: parameters, ms/step (median of the timed steps, each ended by a device
synchronize), tokens/s, GPU peak allocated and reserved over the timed steps (and the peak allocated
before them, setup and warmup included), the host's peak RSS over the whole process (ru_maxrss), the
RSS (VmRSS) the optimizer added from its construction to the end of its first step (pinned buffers as
the kernel counts them), and the precision of weights, master, gradients, m and v as read from the
peer's own tensors after that step. A peer that runs out of memory prints "out of memory"; one that
fails otherwise prints its error. With --peer both each peer runs in a process of its own (this script
again), so neither's memory counts against the other's, and the lines are repeated at the end.
--dry-run builds the model (on the CPU when no GPU is there), runs one forward and backward without any
peer's optimizer and prints the parameter count. Without a GPU the deepspeed peer runs too (Gloo, its
CPU accelerator): a check of the config, not a measurement; torchao's refuses (CUDA or XPU only).
"""
import argparse
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp2_gpt import GPT, init_shards  # noqa: E402  (the model and its initialization, shared with the FSDP2 peer)

GIB = 2.0 ** 30
TAG = "offload-peer"


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", choices=["torchao", "deepspeed", "both"], default="both")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="sequences per step")
    ap.add_argument("--steps", type=int, default=6, help="timed steps, after --warmup")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (at least 1 is run)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                    help="the weights on the GPU: bf16, or fp32 with bf16 autocast compute")
    ap.add_argument("--offload-gradients", action="store_true",
                    help="torchao: free each GPU gradient once it is on the host")
    ap.add_argument("--ds-master", choices=["fp32", "bf16-master", "bf16"], default="fp32",
                    help="deepspeed with --dtype bf16: fp32 master/m/v (its default), bf16 master and "
                         "gradients with fp32 m/v, or all bf16")
    ap.add_argument("--ds-bucket", type=float, default=5e8,
                    help="deepspeed: reduce_bucket_size and allgather_bucket_size, elements (its default 5e8)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--dry-run", action="store_true",
                    help="build the model, one forward and backward without a peer's optimizer, print parameters")
    return ap.parse_args()


def rss_gib():
    """This process's resident set now (VmRSS), GiB; pinned host buffers are resident."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2.0 ** 20
    except OSError:
        pass
    return float("nan")


def peak_rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2.0 ** 20  # KiB on Linux


def build_model(args, dev):
    torch.manual_seed(1234)
    with torch.device("meta"):
        model = GPT(args.vocab, args.context, args.layers, args.width, args.heads)
    if args.dtype == "bf16":
        model.to(torch.bfloat16)  # on meta: the weights are made in bf16, never in fp32 on the GPU
    model.to_empty(device=dev)
    init_shards(model, args.layers)
    model.train()
    return model


def loss_fn(model, idx, args, dev):
    autocast = args.dtype == "fp32" and dev.type == "cuda"
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(idx[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, args.vocab), idx[:, 1:].reshape(-1))


def where(t):
    """A tensor's dtype and place as read from it, e.g. 'bf16 cpu pinned'."""
    if t is None:
        return "none"
    name = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(t.dtype, str(t.dtype))
    pinned = ""
    if t.device.type == "cpu":
        try:
            pinned = " pinned" if t.is_pinned() else ""
        except RuntimeError:
            pass
    return f"{name} {t.device.type}{pinned}"


def setup_torchao():
    from torchao.optim import CPUOffloadOptimizer
    return CPUOffloadOptimizer


def make_torchao(args, model, CPUOffloadOptimizer):
    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, offload_gradients=args.offload_gradients,
                              fused=True, lr=args.lr, weight_decay=args.weight_decay)

    def precision():  # read from the tensors of the largest offloaded parameter, after a step
        p_dev = max(opt.param_d2h_map, key=lambda p: p.numel())
        p_host = opt.param_d2h_map[p_dev]
        st = opt.optim_dict[p_dev].state[p_host]
        kept = sum(len(g["params"]) for g in opt.d_opt.param_groups) if opt.d_opt is not None else 0
        return (f"weights {where(p_dev)}{' (bf16 autocast)' if args.dtype == 'fp32' else ''}; "
                f"host copy {where(p_host)}, grad {where(p_host.grad)}, m {where(st.get('exp_avg'))}, "
                f"v {where(st.get('exp_avg_sq'))}, no other master; {kept} tensors under 4096 elements "
                f"stepped on the GPU; fused CPU AdamW, {torch.get_num_threads()} threads"
                + (", offload_gradients" if args.offload_gradients else ""))

    def step(idx, dev):
        loss = loss_fn(model, idx, args, dev)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, precision


def setup_deepspeed():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    import deepspeed
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)
    return deepspeed


def make_deepspeed(args, model, deepspeed):
    bf16 = args.dtype == "bf16"
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": args.weight_decay}},
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "contiguous_gradients": True,
            "overlap_comm": True,
            "reduce_bucket_size": int(args.ds_bucket),
            "allgather_bucket_size": int(args.ds_bucket),
        },
    }
    if bf16:
        config["bf16"] = {"enabled": True,
                          "bf16_master_weights_and_grads": args.ds_master in ("bf16-master", "bf16"),
                          "bf16_optimizer_states": args.ds_master == "bf16"}
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    inner = getattr(opt, "optimizer", opt)  # the ZeRO optimizer's DeepSpeedCPUAdam

    def precision():  # read from ZeRO's flat buffers and the CPU Adam's state, after a step
        master = opt.single_partition_of_fp32_groups[0]  # named fp32, bf16 under bf16_master_weights_and_grads
        st = inner.state.get(master, {})
        flat = opt.bit16_groups_flat[0]
        return (f"weights {where(flat)}{' (bf16 autocast)' if not bf16 else ''}; host master {where(master)}, "
                f"grad {where(master.grad)}, m {where(st.get('exp_avg'))}, v {where(st.get('exp_avg_sq'))}; "
                f"ZeRO-2 offload, {type(inner).__name__}, no clipping, bf16 grad overflow check "
                f"{'on' if bf16 and engine._config.bfloat16_config.check_grad_overflow else 'off'}")

    def step(idx, dev):
        loss = loss_fn(engine, idx, args, dev)
        engine.backward(loss)
        engine.step()  # the optimizer's step and zero_grad
        return loss

    return step, precision


def run_peer(args):
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        torch.cuda.init()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = build_model(args, dev)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device=dev).manual_seed(0)

    def tokens():
        return torch.randint(0, args.vocab, (args.batch, args.context + 1), device=dev, generator=gen)

    head = f"{TAG} {args.peer}: {params / 1e9:.3f}B parameters, batch {args.batch} x {args.context}, {args.dtype}"

    if args.dry_run:
        loss = loss_fn(model, tokens(), args, dev)
        loss.backward()
        sync()
        grads = sum(p.grad is not None for p in model.parameters())
        print(f"{TAG} dry-run: {params} parameters ({params / 1e9:.3f}B), {args.layers} layers x width {args.width}, "
              f"{args.heads} heads, {args.dtype} on {dev}, loss {loss.item():.4f} (ln {args.vocab} = "
              f"{math.log(args.vocab):.4f}), {grads}/{len(list(model.parameters()))} gradients", flush=True)
        return

    # The peer's modules imported (and DeepSpeed's one-rank process group made) before the baseline, so
    # that the host memory counted is the optimizer's.
    setup, make = (setup_torchao, make_torchao) if args.peer == "torchao" else (setup_deepspeed, make_deepspeed)
    module = setup()
    sync()
    rss0 = rss_gib()
    try:
        step, precision = make(args, model, module)
        step(tokens(), dev)  # the first step: the peers' host buffers are all made by its end
        sync()
        rss1 = rss_gib()
        precision = precision()
        for _ in range(args.warmup - 1):
            step(tokens(), dev)
        sync()
        warm_peak = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0  # setup and warmup included
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            idx = tokens()
            t = time.perf_counter()
            loss = step(idx, dev)
            sync()
            times.append(time.perf_counter() - t)
    except torch.cuda.OutOfMemoryError as e:
        first = str(e).split("\n")[0][:160]
        print(f"{head}: out of memory ({first})", flush=True)
        return
    ms = 1e3 * statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0
    reserved = torch.cuda.max_memory_reserved() / GIB if cuda else 0.0
    print(f"{head}: {ms:.1f} ms/step (median of {args.steps}; min {1e3 * min(times):.1f}), "
          f"{args.batch * args.context / (ms / 1e3):.0f} tokens/s, GPU peak allocated {peak:.2f} GiB, "
          f"reserved {reserved:.2f} GiB (setup and warmup's peak allocated {warm_peak:.2f} GiB), "
          f"host peak RSS {peak_rss_gib():.2f} GiB, host +{rss1 - rss0:.2f} GiB by the optimizer's first step "
          f"({(rss1 - rss0) * GIB / params:.1f} B/param), loss {loss.item():.4f}; state: {precision}", flush=True)


def main():
    args = parse()
    # Never NVLink multicast on the lent machines (KINDS.md); harmless elsewhere.
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    if args.peer != "both" or args.dry_run:
        try:
            run_peer(args)
        except Exception as e:  # a peer's failure is a result, not a crash of the whole comparison
            first = str(e).splitlines()[0][:300] if str(e) else ""
            if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e):
                print(f"{TAG} {args.peer}: out of memory ({type(e).__name__}: {first})", flush=True)
                return
            print(f"{TAG} {args.peer}: failed: {type(e).__name__}: {first}", flush=True)
            raise
        return
    argv = [a for a in sys.argv[1:]]
    i = argv.index("--peer") if "--peer" in argv else None
    if i is not None:
        del argv[i:i + 2]
    argv = [a for a in argv if not a.startswith("--peer=")]
    results = []
    for peer in ("torchao", "deepspeed"):
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer", peer] + argv,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        said = False
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith(f"{TAG} {peer}:"):
                said = True
                results.append(line.rstrip("\n"))
        rc = proc.wait()
        if not said:
            why = f"signal {-rc} (killed: host memory?)" if rc < 0 else f"exit code {rc}"
            results.append(f"{TAG} {peer}: failed, no result ({why})")
            print(results[-1], flush=True)
    print("\n".join(["", "summary:"] + results), flush=True)  # the peers' lines again, after their logs


if __name__ == "__main__":
    main()
