"""A tiny data-parallel training script for the torchrun integration test.

Launched by torchrun; trains a linear model on ``range(N)`` for ``--steps`` steps (or to the end
of the epoch), logging every sample index each rank consumes, then saves an elastic checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.getcwd())

import dloader
from dloader.integrations.torchrun import resume, save_checkpoint
from tests.loader.datasets import Range


def param_hash(model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for v in model.state_dict().values():
        h.update(v.detach().numpy().tobytes())
    for st in opt.state_dict()["state"].values():
        h.update(st["momentum_buffer"].numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--train-steps", type=int, default=10**9)
    parser.add_argument("--n", type=int, default=120)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    ds = Range(args.n)
    sampler = dloader.ElasticDistributedSampler(ds, seed=7)
    loader = dloader.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1)
    extra = resume(args.ckpt_dir, model=model, optimizer=opt, loader=loader)
    step = int(extra.get("step", 0))
    with open(f"{args.events}.rank{rank}.world{world}.jsonl", "a") as log:
        if extra:
            log.write(
                json.dumps({"event": "loaded", "step": step, "hash": param_hash(model.module, opt)})
                + "\n"
            )
        sampler.set_epoch(int(extra.get("epoch", 0)))
        for done, batch in enumerate(loader, start=1):
            log.write(json.dumps({"event": "batch", "indices": [int(i) for i in batch]}) + "\n")
            x = batch.float().unsqueeze(1) / args.n
            loss = ((model(x) - x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if done == args.train_steps:
                break
        else:
            log.write(json.dumps({"event": "epoch_end"}) + "\n")
        save_checkpoint(
            args.ckpt_dir,
            step,
            model=model,
            optimizer=opt,
            loader=loader,
            extra={"step": step, "epoch": 0},
        )
        log.write(
            json.dumps({"event": "saved", "step": step, "hash": param_hash(model.module, opt)})
            + "\n"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
