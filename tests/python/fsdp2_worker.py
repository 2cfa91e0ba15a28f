"""One rank of test_fsdp2.py: parameters sharded by FSDP2's fully_shard over Gloo, stepped by lowbit.optim with the
gradients the test gives (the same values one process steps), then the whole parameters and every rank's state
written for the test to compare.
    python fsdp2_worker.py RANK WORLD PORT IN OUT"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

import lowbit


def main(rank, world, port, src, dst):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    spec = torch.load(src, weights_only=False)
    results = []
    for cls_name, options, dtype in spec["configs"]:
        module = torch.nn.Module()
        module.params = torch.nn.ParameterList([torch.nn.Parameter(t.detach().to(dtype).clone()) for t in spec["init"]])
        fully_shard(module)
        params = list(module.params)
        opt = getattr(lowbit.optim, cls_name)(params, **options)
        for grads in spec["grads"]:
            for p, g in zip(params, grads):
                p.grad = distribute_tensor(g.to(dtype), p.device_mesh, [Shard(0)])
            opt.step()
        whole = [p.full_tensor() for p in params]
        mine = {i: {k: v for k, v in opt.state[p].items()} for i, p in enumerate(params) if p in opt.state}
        states = [None] * world
        dist.all_gather_object(states, mine)
        results.append(dict(params=whole, states=states, skipped=opt.skipped_steps()))
    if rank == 0:
        torch.save(results, dst)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
