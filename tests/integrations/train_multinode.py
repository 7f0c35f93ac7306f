"""A tiny data-parallel job for the multi-node launcher test, launched by dloader-launch.

Trains a linear model (SGD with momentum) on ``range(N)`` with an elastic sampler and one
elastic checkpoint per step. Rank 0 logs each committed step once the checkpoint is written:
the indices every rank consumed (gathered before the save) and a hash of the model and
optimizer state saved; after a restart it logs the hash of the state it loaded. SIGTERM (a
restart by the launcher) ends every rank after the same step; a dead peer ends it by error, and
torchrun restarts the survivors from the last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.getcwd())

import dloader
from dloader.integrations.torchrun import resume, save_checkpoint
from tests.integrations.train_elastic import param_hash as state_hash
from tests.loader.datasets import Range


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--step-s", type=float, default=0.1)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    ds = Range(args.samples)
    sampler = dloader.ElasticDistributedSampler(ds, seed=5)
    loader = dloader.DataLoader(ds, batch_size=2, sampler=sampler)
    extra = resume(args.ckpt_dir, model=model, optimizer=opt, loader=loader)
    step = int(extra.get("step", 0))
    sampler.set_epoch(0)

    def event(**e: object) -> None:
        if rank == 0:
            with open(args.events, "a") as log:
                generation = int(os.environ.get("DLOADER_GENERATION", "0"))
                log.write(json.dumps({**e, "world": world, "generation": generation}) + "\n")

    if extra:
        event(event="loaded", step=step, hash=state_hash(model.module, opt))
    else:
        event(event="start")
    for batch in loader:
        x = batch.float().unsqueeze(1) / args.samples
        loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        every: list[list[int]] = [[] for _ in range(world)]
        dist.all_gather_object(every, [int(i) for i in batch])
        save_checkpoint(
            args.ckpt_dir, step, model=model, optimizer=opt, loader=loader, extra={"step": step}
        )
        event(
            event="step",
            step=step,
            indices=[i for part in every for i in part],
            hash=state_hash(model.module, opt),
        )
        stop.wait(args.step_s)
        flag = torch.tensor([float(stop.is_set())])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops after the same step
        if flag.item():
            return
    event(event="done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
