"""bench/peers.py: AdamW steps on the GPU through torch.ops.lowbit beside the optimizers a user would pick
instead, in one run: torch.optim.AdamW(fused=True), bitsandbytes' AdamW8bit, torchao's AdamW8bit / 4bit / Fp8
and FlashOptim's FlashAdamW. Prints ms per step (median of CUDA-event timings), bytes of optimizer state per
parameter, and each time over torch's fused AdamW.

    LOWBIT_LIBRARY=build/liblowbit.so PYTHONPATH=python python3 bench/peers.py [tensors rows cols]

A peer that is not installed, or fails, prints its error instead of a time.
"""
import sys
import time

import torch

import lowbit


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def state_bytes(opt):
    total = 0
    for st in opt.state.values():
        for v in st.values() if isinstance(st, dict) else []:
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
            elif hasattr(v, "__tensor_flatten__"):  # torchao's subclass tensors
                names, _ = v.__tensor_flatten__()
                total += sum(getattr(v, n).numel() * getattr(v, n).element_size() for n in names)
    return total


def make(shape, count, dtype):
    params = [torch.randn(shape, device="cuda").to(dtype).requires_grad_() for _ in range(count)]
    for p in params:
        p.grad = (torch.randn(shape, device="cuda") * 1e-2).to(dtype)
    return params


def lowbit_step(params, state_format, master_weight_bits=0, check=True):
    ops = torch.ops.lowbit
    grads = [p.grad for p in params]
    states = [lowbit.optim.init_state(p, "AdamW", state_format, master_weight_bits=master_weight_bits) for p in params]
    lr = torch.tensor([1e-3], dtype=torch.float64, device="cuda")
    groups = [0] * len(params)

    def step():
        found_inf = ops.grad_check(grads, groups, 1, False)[0] if check else None
        with torch.no_grad():
            lowbit.optim.step(params, grads, states, lr, rule="AdamW", weight_decay=1e-2, found_inf=found_inf)

    nbytes = sum(t.numel() * t.element_size() for s in states for t in s.tensors)
    return step, nbytes


def peer(name, make_opt, params):
    opt = make_opt(params)
    opt.step()
    return opt.step, state_bytes(opt)


def main():
    tensors, rows, cols = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (64, 4096, 4096)
    lowbit.load_library()
    n = tensors * rows * cols
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, {tensors} x {rows} x {cols} = {n / 1e9:.3f} B "
          f"params, median of 20 steps")
    rows_out = []
    cases = [
        ("torch AdamW fused, fp32", torch.float32, lambda p: peer("torch", lambda q: torch.optim.AdamW(q, lr=1e-3, fused=True), p)),
        ("lowbit AdamW Q8, fp32", torch.float32, lambda p: lowbit_step(p, "Q8")),
        ("lowbit AdamW Q4, fp32", torch.float32, lambda p: lowbit_step(p, "Q4")),
        ("lowbit AdamW FP8, fp32", torch.float32, lambda p: lowbit_step(p, "FP8")),
        ("lowbit AdamW C8, fp32", torch.float32, lambda p: lowbit_step(p, "C8")),
    ]
    try:
        import bitsandbytes as bnb
        cases.append(("bitsandbytes AdamW8bit, fp32", torch.float32, lambda p: peer("bnb", lambda q: bnb.optim.AdamW8bit(q, lr=1e-3), p)))
    except Exception as e:  # noqa: BLE001
        print(f"bitsandbytes: not available ({e})")
    try:
        from torchao.optim import AdamW4bit, AdamW8bit, AdamWFp8
        cases += [("torchao AdamW8bit, fp32", torch.float32, lambda p: peer("ao8", lambda q: AdamW8bit(q, lr=1e-3), p)),
                  ("torchao AdamW4bit, fp32", torch.float32, lambda p: peer("ao4", lambda q: AdamW4bit(q, lr=1e-3), p)),
                  ("torchao AdamWFp8, fp32", torch.float32, lambda p: peer("aofp8", lambda q: AdamWFp8(q, lr=1e-3), p))]
    except Exception as e:  # noqa: BLE001
        print(f"torchao: not available ({e})")
    try:
        from flashoptim import FlashAdamW
        cases += [("flashoptim FlashAdamW, fp32", torch.float32,
                   lambda p: peer("fo", lambda q: FlashAdamW(q, lr=1e-3, master_weight_bits=None), p)),
                  ("flashoptim FlashAdamW, bf16 + 24-bit master", torch.bfloat16,
                   lambda p: peer("fo24", lambda q: FlashAdamW(q, lr=1e-3, master_weight_bits=24), p))]
    except Exception as e:  # noqa: BLE001
        print(f"flashoptim: not available ({e})")
    cases.append(("lowbit AdamW Q8, bf16", torch.bfloat16, lambda p: lowbit_step(p, "Q8")))
    cases.append(("lowbit AdamW Q8, bf16 + 24-bit master", torch.bfloat16, lambda p: lowbit_step(p, "Q8", 24)))
    cases.append(("lowbit AdamW Q8, bf16 + 24-bit master, no check", torch.bfloat16,
                  lambda p: lowbit_step(p, "Q8", 24, check=False)))
    cases.append(("lowbit AdamW C8, bf16 + 24-bit master", torch.bfloat16, lambda p: lowbit_step(p, "C8", 24)))
    cases.append(("lowbit AdamW C8, bf16 + 24-bit master, no check", torch.bfloat16,
                  lambda p: lowbit_step(p, "C8", 24, check=False)))
    cases.append(("lowbit AdamW Q8, bf16 + 32-bit master", torch.bfloat16, lambda p: lowbit_step(p, "Q8", 32)))
    cases.append(("torch AdamW fused, bf16", torch.bfloat16, lambda p: peer("torchbf", lambda q: torch.optim.AdamW(q, lr=1e-3, fused=True), p)))
    base = None
    for name, dtype, build in cases:
        params = make((rows, cols), tensors, dtype)
        try:
            step, nbytes = build(params)
            ms = median_ms(step)
            if base is None:
                base = ms
            rows_out.append((name, ms, nbytes / n))
            print(f"{name:44s} {ms:9.3f} ms  {ms / base:5.2f} x torch fused  {nbytes / n:5.2f} B/param state", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:44s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del params
        torch.cuda.empty_cache()
        time.sleep(0.5)


if __name__ == "__main__":
    main()
