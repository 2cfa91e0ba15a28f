"""One rank of test_fsdp2.py's refusal test: a DTensor parameter that is not Shard(0) on a 1-D mesh (what
fully_shard makes) is refused at step() naming its placement, and the refused step changes no parameter and keeps no
state.
    python fsdp2_refusal_worker.py RANK WORLD PORT OUT"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import lowbit
import rank_exit


def refused(cls_name, options, placement, expect):
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    params = [torch.nn.Parameter(distribute_tensor(torch.randn(61, 97), mesh, [placement]))]
    opt = getattr(lowbit.optim, cls_name)(params, **options)
    before = [p.to_local().clone() for p in params]
    for p in params:
        p.grad = distribute_tensor(torch.randn(p.shape) * 0.1, mesh, [placement])
    try:
        opt.step()
    except RuntimeError as e:
        message = str(e)
    else:
        return f"{cls_name} {options} {placement}: step() was not refused"
    if not all(x in message for x in expect):
        return f"{cls_name} {options} {placement}: the message lacks {expect}: {message}"
    if not all(torch.equal(b, p.to_local()) for b, p in zip(before, params)) or len(opt.state):
        return f"{cls_name} {options} {placement}: the refused step changed parameters or kept state"
    return None


def main(rank, world, port, dst):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    problems = [refused("AdamW", dict(state_format="Q8", min_quant_numel=64), Shard(1), ["Shard(0)", "Shard(dim=1)"]),
                refused("LAMB", dict(state_format="FP32"), Shard(1), ["Shard(0)", "Shard(dim=1)"])]
    problems = [p for p in problems if p]
    everywhere = [None] * world
    dist.all_gather_object(everywhere, problems)
    if rank == 0:
        torch.save([p for rank_problems in everywhere for p in rank_problems], dst)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    rank_exit.exit_rank()
