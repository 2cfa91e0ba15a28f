"""bench/peers.py: AdamW steps on the GPU through torch.ops.lowbit beside the optimizers a user would pick
instead, in one run: torch.optim.AdamW(fused=True), bitsandbytes' AdamW8bit, torchao's AdamW8bit / 4bit / Fp8
and FlashOptim's FlashAdamW. Prints ms per step (median of CUDA-event timings), bytes of optimizer state per
parameter, and each time over torch's fused AdamW.

    LOWBIT_LIBRARY=build/liblowbit.so PYTHONPATH=python python3 bench/peers.py [tensors rows cols]

With --cpu, the CPU's peers instead: torch.optim.AdamW(fused=True) (at::_fused_adamw_) and DeepSpeed's
DeepSpeedCPUAdam (its AVX-512 / AVX2 C++ op, built on first use), beside lowbit's FP32 / Q8 / Q4 / FP8
AdamW with and without the non-finite check, and a copy of 16 bytes per parameter (wall-clock medians;
threads: OMP_NUM_THREADS, which torch and DeepSpeed follow too). Default size 1 x 8192 x 8192 (2^26).

With --classes, the Python optimizer class lowbit.optim.AdamW against the op it calls (grad_check and the
step, as above), on the given tensors and on 64 times as many tensors an eighth as wide and high; on a GPU
also the class's recorded step replayed alone (the device's part), its step's host time (the host's), and the op and
the class with 10 steps enqueued back to back, as a training loop runs them (the time per step).

A peer that is not installed, or fails, prints its error instead of a time.
"""
import sys
import time

import torch

import lowbit

DEVICE = "cpu" if "--cpu" in sys.argv else "cuda"


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    if DEVICE == "cpu":
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]
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
    params = [torch.randn(shape, device=DEVICE).to(dtype).requires_grad_() for _ in range(count)]
    for p in params:
        p.grad = (torch.randn(shape, device=DEVICE) * 1e-2).to(dtype)
    return params


def lowbit_step(params, state_format, master_weight_bits=0, check=True):
    ops = torch.ops.lowbit
    grads = [p.grad for p in params]
    states = [lowbit.optim.init_state(p, "AdamW", state_format, master_weight_bits=master_weight_bits) for p in params]
    lr = torch.tensor([1e-3], dtype=torch.float64, device=DEVICE)
    groups = [0] * len(params)

    def step():
        found_inf = ops.grad_check(grads, groups, 1, False)[0] if check else None
        with torch.no_grad():
            lowbit.optim.step(params, grads, states, lr, rule="AdamW", weight_decay=1e-2, found_inf=found_inf)

    nbytes = sum(t.numel() * t.element_size() for s in states for t in s.tensors)
    return step, nbytes


def class_step(params, state_format, graphs=True):
    # The Python optimizer class (lowbit.optim.AdamW) as a user steps it: its grad check, param groups
    # and state included; its first step (the state's creation) outside the timing. Its steps are
    # recorded as a CUDA graph and replayed from the third on (set_step_graphs; graphs=False: not).
    opt = lowbit.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, state_format=state_format)
    opt.set_step_graphs(graphs)
    opt.step()
    return opt.step, state_bytes(opt)


def class_replay(params, state_format):
    # The class's recorded step alone: its CUDA graph replayed, no host work around it (the device's
    # part of a replayed step).
    opt = lowbit.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, state_format=state_format)
    for _ in range(3):
        opt.step()  # state made, inputs remembered, recorded
    graph = opt._step_graph._graph
    if graph is None:
        raise RuntimeError("the step was not recorded")
    return graph.replay, state_bytes(opt)


def class_host(params, state_format):
    # The host's part of a replayed step: opt.step() timed on the host, each after the device is idle
    # (so no launch waits for room in the queue).
    opt = lowbit.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, state_format=state_format)
    for _ in range(3):
        opt.step()

    def step():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        host.append((time.perf_counter() - t0) * 1e3)

    host = []
    return step, state_bytes(opt), host


def back_to_back(build, steps=10):
    # `steps` steps enqueued one after another, timed together (as a training loop runs them: the host's part of a
    # step goes on while the device still works on the last one); the row gives the time per step.
    def make_steps(params):
        step, nbytes, *_ = build(params)

        def steps_run():
            for _ in range(steps):
                step()

        return steps_run, nbytes, steps

    return make_steps


def class_cases(tensors, rows, cols):
    # The class beside the raw op (grad_check + step) it calls, on the given tensors and on 64 times as
    # many tensors an eighth as wide and high (the same parameter count: 4096 x 512 x 512 for the GPU's
    # default 64 x 4096 x 4096), where the per-tensor cost of the host's side shows.
    small = (tensors * 64, max(rows // 8, 1), max(cols // 8, 1))
    cases = []
    for shape in ((tensors, rows, cols), small):
        cases += [(shape, "lowbit op AdamW Q8 (grad_check + step)", lambda p: lowbit_step(p, "Q8")),
                  (shape, "lowbit.optim.AdamW Q8 (the class)", lambda p: class_step(p, "Q8")),
                  (shape, "lowbit.optim.AdamW Q8 (the class, no step graphs)", lambda p: class_step(p, "Q8", False))]
        if DEVICE == "cuda":
            cases.append((shape, "the class's recorded step, replayed alone", lambda p: class_replay(p, "Q8")))
            cases.append((shape, "the class's step, host time (device idle)", lambda p: class_host(p, "Q8")))
            cases.append((shape, "lowbit op AdamW Q8, 10 steps back to back", back_to_back(lambda p: lowbit_step(p, "Q8"))))
            cases.append((shape, "lowbit.optim.AdamW Q8, 10 steps back to back",
                          back_to_back(lambda p: class_step(p, "Q8"))))
    return cases


def run_class_cases(tensors, rows, cols):
    print(f"{DEVICE}, torch {torch.__version__}: the Python class against the op it calls, fp32 parameters, "
          f"median of 20 steps")
    base = None
    for (t, r, c), name, build in class_cases(tensors, rows, cols):
        params = make((r, c), t, torch.float32)
        try:
            step, nbytes, *extra = build(params)
            ms = median_ms(step)
            if extra and isinstance(extra[0], list):  # a host-side time: the median of what the step recorded
                ms = sorted(extra[0])[len(extra[0]) // 2]
            elif extra:  # several steps a call: the time per step
                ms /= extra[0]
            base = base or ms
            print(f"{t:5d} x {r:5d} x {c:5d}  {name:50s} {ms:9.3f} ms  {ms / base:5.3f} x the op on {tensors} tensors  "
                  f"{nbytes / (t * r * c):5.2f} B/param state", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{t} x {r} x {c} {name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del params
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def peer(name, make_opt, params):
    opt = make_opt(params)
    opt.step()
    return opt.step, state_bytes(opt)


def copy_step(params):
    # The bytes a Q8 AdamW step moves (16 per parameter: 8 read, 8 written), as one copy_ per tensor.
    src = [torch.empty(p.numel() * 2, dtype=torch.float32, device=DEVICE).fill_(1) for p in params]
    dst = [torch.empty_like(s) for s in src]

    def step():
        for d, s in zip(dst, src):
            d.copy_(s)

    return step, 0


def cpu_cases():
    cases = [
        ("torch AdamW fused, fp32", torch.float32, lambda p: peer("torch", lambda q: torch.optim.AdamW(q, lr=1e-3, fused=True), p)),
        ("copy of 16 B/param", torch.float32, copy_step),
    ]
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        cases.append(("DeepSpeed CPUAdam (adamw), fp32", torch.float32,
                      lambda p: peer("ds", lambda q: DeepSpeedCPUAdam(q, lr=1e-3, adamw_mode=True), p)))
    except Exception as e:  # noqa: BLE001
        print(f"deepspeed: not available ({e})")
    for fmt in ("FP32", "Q8", "Q4", "FP8"):
        cases.append((f"lowbit AdamW {fmt}, fp32", torch.float32, lambda p, f=fmt: lowbit_step(p, f)))
        cases.append((f"lowbit AdamW {fmt}, fp32, no check", torch.float32, lambda p, f=fmt: lowbit_step(p, f, check=False)))
    return cases


def main():
    sizes = [int(a) for a in sys.argv[1:] if not a.startswith("--")]
    tensors, rows, cols = sizes[:3] if len(sizes) > 2 else ((1, 8192, 8192) if DEVICE == "cpu" else (64, 4096, 4096))
    lowbit.load_library()
    if "--classes" in sys.argv:
        return run_class_cases(tensors, rows, cols)
    if DEVICE == "cpu":
        return run_cases(cpu_cases(), tensors, rows, cols,
                         f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, {tensors} x {rows} x {cols} = "
                         f"{tensors * rows * cols / 1e6:.1f} M params, median of 20 steps")
    n = tensors * rows * cols
    title = (f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, {tensors} x {rows} x {cols} = {n / 1e9:.3f} B "
             f"params, median of 20 steps")
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
    run_cases(cases, tensors, rows, cols, title)


def run_cases(cases, tensors, rows, cols, title):
    print(title)
    n = tensors * rows * cols
    base = None
    for name, dtype, build in cases:
        params = make((rows, cols), tensors, dtype)
        try:
            step, nbytes = build(params)
            ms = median_ms(step)
            if base is None:
                base = ms
            print(f"{name:44s} {ms:9.3f} ms  {ms / base:5.2f} x torch fused  {nbytes / n:5.2f} B/param state", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:44s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del params
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        time.sleep(0.5)


if __name__ == "__main__":
    main()
