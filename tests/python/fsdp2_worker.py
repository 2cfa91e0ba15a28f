"""One rank of test_fsdp2.py: parameters sharded by FSDP2's fully_shard over Gloo (CPU) or NCCL (one GPU a rank),
stepped by lowbit.optim with the gradients the test gives (the same values one process steps), then the whole
parameters and every rank's state written (on the CPU) for the test to compare (taken before a last step that checks
a state_dict() round trip).
    python fsdp2_worker.py RANK WORLD PORT IN OUT [gloo|nccl]"""
import io
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import lowbit
import rank_exit
from lowbit.optim import dtensor_shards


DEVICE = torch.device("cpu")


def sharded(cls_name, options, dtype, values):
    module = torch.nn.Module()
    module.params = torch.nn.ParameterList([torch.nn.Parameter(t.detach().to(DEVICE, dtype).clone()) for t in values])
    fully_shard(module)
    params = list(module.params)
    return params, getattr(lowbit.optim, cls_name)(params, **options)


def step(params, opt, grads, dtype):
    for p, g in zip(params, grads):
        p.grad = distribute_tensor(g.to(DEVICE, dtype), p.device_mesh, [Shard(0)])
    opt.step()


def cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def main(rank, world, port, src, dst, backend="gloo"):
    global DEVICE
    if backend == "nccl":
        DEVICE = torch.device("cuda", rank)
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=DEVICE if backend == "nccl" else None)
    spec = torch.load(src, weights_only=False)
    results = []
    for cls_name, options, dtype in spec["configs"]:
        params, opt = sharded(cls_name, options, dtype, spec["init"])
        for grads in spec["grads"]:
            step(params, opt, grads, dtype)
        whole = [p.full_tensor().detach().cpu().clone() for p in params]  # (one rank: a view of the shard)
        mine = {i: {k: cpu(v).clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
                for i, p in enumerate(params) if p in opt.state}
        states = [None] * world
        dist.all_gather_object(states, mine)
        # Each rank's state_dict(), through a file (torch.load's weights_only), loads back into a new optimizer over
        # the same shards: the next step is the same.
        params2, opt2 = sharded(cls_name, options, dtype, [p.full_tensor() for p in params])
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        buf.seek(0)
        opt2.load_state_dict(torch.load(buf, weights_only=True))
        for ps, op in [(params, opt), (params2, opt2)]:
            step(ps, op, spec["grads"][0], dtype)
        resumed = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(params, params2)) and all(
            all(torch.equal(v, opt2.state[b][k]) for k, v in opt.state[a].items() if isinstance(v, torch.Tensor))
            for a, b in zip(params, params2) if a in opt.state)
        everywhere = torch.tensor([int(resumed)], device=DEVICE)
        dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
        results.append(dict(params=whole, states=states, skipped=opt.skipped_steps(), resumed=bool(everywhere)))
    # Clipping's norm alone: each step's gradients, fp32 and bf16, sharded; the sum of squares exact_sumsq makes.
    mesh = init_device_mesh(DEVICE.type, (world,))
    norms = []
    for grads in spec["grads"] + spec["norm_grads"]:
        for dtype in (torch.float32, torch.bfloat16):
            shards = [distribute_tensor(g.to(DEVICE, dtype), mesh, [Shard(0)]) for g in grads]
            norms.append(dtensor_shards.exact_sumsq([(i, g, g) for i, g in enumerate(shards)]))
    if rank == 0:
        torch.save(dict(configs=results, norms=norms), dst)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
    rank_exit.exit_rank()
