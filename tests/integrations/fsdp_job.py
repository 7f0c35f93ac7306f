"""Run under torchrun on CPU/gloo: an FSDP2 (``fully_shard``) model and its Adam optimizer saved
through ``dloader.elastic`` at one world size and loaded at another.

``--phase save``: one training step, then ``elastic.save``; rank 0 writes the full (gathered)
model and optimizer state to ``<out>/save.pt``. ``--phase load``: a fresh model and optimizer,
``elastic.load``; rank 0 writes the full state it now has to ``<out>/load.pt``, and every rank
records the shape of its own shard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dloader import elastic

sys.path.insert(0, os.getcwd())  # torchrun runs in the repository root

from tests.integrations import end_ranks


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(7, 33), torch.nn.ReLU(), torch.nn.Linear(33, 5), torch.nn.Linear(5, 3)
    )
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, opt, options=options)
    return {"model": model_sd, "optim": optim_sd}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=("save", "load"), required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = build()
    if args.phase == "save":
        x = torch.randn(16, 7, generator=torch.Generator().manual_seed(rank))
        model(x).pow(2).mean().backward()
        opt.step()
        elastic.save(args.out / "ckpt", model=model, optimizer=opt, extra={"step": 1})
    else:
        extra = elastic.load(args.out / "ckpt", model=model, optimizer=opt)
        assert extra == {"step": 1}, extra
    shards = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
    state = full_state(model, opt)  # collective
    if rank == 0:
        torch.save(state, args.out / f"{args.phase}.pt")
    (args.out / f"{args.phase}.rank{rank}.json").write_text(
        json.dumps({"world": world, "shards": shards})
    )
    end_ranks()


if __name__ == "__main__":
    main()
