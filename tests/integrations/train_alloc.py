"""A tiny data-parallel job for the allocator end-to-end test, launched by dloader-launch.

Trains a linear model on ``range(N)`` with an elastic sampler and one checkpoint per step, so a
restart by the launcher loses nothing (SIGTERM ends every rank after the same step); it sleeps
per step to live long enough to be re-allocated. The loader cooperates with the node sidecar
(``DLOADER_SIDECAR``, job name ``DLOADER_JOB_NAME``) and allows batch sizes in
``[1, --max-batch]``. After each committed step every rank logs the indices it consumed, its
world size and its local batch size.
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
from dloader.integrations.torchrun import resume, save_checkpoint, sync_batch_size
from tests.loader.datasets import Range


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--batch", type=int, default=2, help="local batch size at start")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--step-s", type=float, default=0.1)
    args = parser.parse_args()
    stop = threading.Event()  # SIGTERM (a restart by the launcher): finish the step, then exit
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ds = Range(args.samples)
    sampler = dloader.ElasticDistributedSampler(ds, seed=3)
    loader = dloader.DataLoader(
        ds,
        batch_size=args.batch,
        sampler=sampler,
        num_workers=1,
        min_workers=1,
        max_workers=1,
        batch_size_range=(1, args.max_batch),
    )
    extra = resume(args.ckpt_dir, model=model, optimizer=opt, loader=loader)
    step = int(extra.get("step", 0))
    sampler.set_epoch(0)
    with open(f"{args.events}.{os.getpid()}.jsonl", "a") as log:
        log.write(json.dumps({"event": "start", "rank": rank, "world": world}) + "\n")
        log.flush()
        for batch in loader:
            x = batch.float().unsqueeze(1) / args.samples
            loss = ((model(x) - x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            sync_batch_size(loader)  # the sidecar's batch size, on every rank at the same batch
            save_checkpoint(
                args.ckpt_dir, step, model=model, optimizer=opt, loader=loader, extra={"step": step}
            )
            log.write(
                json.dumps(
                    {
                        "event": "step",
                        "step": step,
                        "rank": rank,
                        "world": world,
                        "batch": len(batch),
                        "indices": [int(i) for i in batch],
                    }
                )
                + "\n"
            )
            log.flush()
            stop.wait(args.step_s)
            flag = torch.tensor([float(stop.is_set())])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops after the same step
            if flag.item():
                return
        log.write(json.dumps({"event": "done", "rank": rank, "world": world}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
