"""One rank of test_fsdp2.py's checkpoint test, at 3 ranks over Gloo: a model under FSDP2's fully_shard and a lowbit
optimizer, saved and loaded with torch.distributed.checkpoint (get_state_dict, dcp.save, dcp.load, set_state_dict).
Ranks 0 and 1 (a 2-rank mesh) take the first `split` steps, save CKPT2 and take the rest; then the 3 ranks load CKPT2
into a model of zeros (and one process's state_dict() at that step, the spec's "whole", into another optimizer:
the same state), save it again as CKPT3 and take the rest. Gradients are the test's (the values one process
steps), so each run's bits compare with one process's.
    python fsdp2_dcp_worker.py RANK 3 PORT SPEC OUT CKPT2 CKPT3
OUT (rank 0): per run, the whole parameters, every rank's state (with its range) and the skipped steps; whether the
"whole" state loaded the same on every rank."""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

import lowbit
import rank_exit


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(61, 97)
        self.b = torch.nn.Linear(97, 5)


def build(spec, values, mesh=None):
    """The model with `values` (by name), sharded per layer and at the root over `mesh` (None: not sharded), and its
    optimizer."""
    model = Net()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(values[name])
    if mesh is not None:
        for m in (model.a, model.b, model):
            fully_shard(m, mesh=mesh)
    named = dict(model.named_parameters())
    groups = [dict(g, params=[named[n] for n in g["params"]]) for g in spec["groups"]]
    return model, getattr(lowbit.optim, spec["optimizer"])(groups, **spec["options"])


def steps(model, opt, grads):
    for step_grads in grads:
        for name, p in model.named_parameters():
            g = step_grads[name]
            p.grad = distribute_tensor(g, p.device_mesh, p.placements) if hasattr(p, "device_mesh") else g.clone()
        opt.step()
        opt.zero_grad()


def save(model, opt, path, group=None):
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path, process_group=group)


def load(spec, path, mesh=None):
    """A model of zeros and a fresh optimizer, loaded from the checkpoint at `path`."""
    model, opt = build(spec, {k: torch.zeros_like(v) for k, v in spec["init"].items()}, mesh)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return model, opt


def result(model, opt, group):
    params = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    mine = {name: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
            for name, p in model.named_parameters() if p in opt.state}
    states = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, mine, group=group)
    return dict(params=params, states=states, skipped=opt.skipped_steps())


def main(rank, world, port, spec_path, out, ckpt2, ckpt3):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    spec = torch.load(spec_path, weights_only=False)
    split = spec["split"]
    results = {}
    two = DeviceMesh("cpu", [0, 1])  # every rank makes it (its process group); ranks 0 and 1 use it
    if rank < 2:
        model, opt = build(spec, spec["init"], two)
        steps(model, opt, spec["grads"][:split])
        save(model, opt, ckpt2, two.get_group())
        steps(model, opt, spec["grads"][split:])
        results["2 ranks, saved"] = result(model, opt, two.get_group())
    dist.barrier()
    three = DeviceMesh("cpu", list(range(world)))
    model, opt = load(spec, ckpt2, three)
    # One process's state_dict() at the same step, loaded as it is: each rank takes its range of the whole tensors.
    other_model, other = build(spec, spec["init"], three)
    other.load_state_dict(spec["whole"])
    same = all(torch.equal(v, other.state[q][k]) if isinstance(v, torch.Tensor) else v == other.state[q][k]
               for p, q in zip(model.parameters(), other_model.parameters()) for k, v in opt.state[p].items())
    save(model, opt, ckpt3)
    steps(model, opt, spec["grads"][split:])
    results["3 ranks, loaded"] = result(model, opt, None)
    everywhere = torch.tensor([int(same)])
    dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
    results["whole state loaded"] = bool(everywhere)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
    rank_exit.exit_rank()
