"""Run under torchrun: Lightning's Trainer.fit with dloader.DataLoader under DDP on CPU.

``--phase ddp``: Lightning's own DistributedSampler (Lightning re-instantiates the loader): the
loader stays a dloader.DataLoader with its options, resizes live, and covers the epoch.
``--phase save`` / ``--phase resume``: ``ElasticDistributedSampler`` with
``use_distributed_sampler=False``: stopped mid-epoch with a checkpoint, resumed under another
world size, every index once.

Each process writes ``<out>/<phase>.rank<R>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import Dataset

import dloader
from dloader.integrations.lightning import DeclareEpochs

sys.path.insert(0, os.getcwd())  # torchrun runs in the repository root

from tests.integrations import end_ranks


class Indexed(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.tensor([float(i % 5)])


class Model(L.LightningModule):
    def __init__(self, elastic: bool, resize_at: int | None = None) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.elastic = elastic
        self.resize_at = resize_at
        self.seen: list[list[int]] = []
        self.loader_info: dict[str, Any] = {}

    def train_dataloader(self) -> dloader.DataLoader:
        data = Indexed(60)
        if self.elastic:
            sampler = dloader.ElasticDistributedSampler(data, seed=4)
            return dloader.DataLoader(
                data, batch_size=3, sampler=sampler, num_workers=1, max_workers=2
            )
        return dloader.DataLoader(
            data, batch_size=3, shuffle=True, num_workers=1, max_workers=2, job_name="lit"
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        idx, x = batch
        self.seen.append(idx.tolist())
        loader = self.trainer.train_dataloader
        if batch_idx == 0:
            self.loader_info = {
                "class": f"{type(loader).__module__}.{type(loader).__name__}",
                "max_workers": getattr(loader, "max_workers", None),
                "sampler": type(loader.sampler).__name__,
                "stats": loader.stats().batches >= 1,
                "epochs": loader.epochs,
                "first_done": loader.stats().done,
            }
        if batch_idx == self.resize_at:
            loader.resize(2)
            self.loader_info["resized_to"] = loader.num_workers
        return torch.nn.functional.mse_loss(self.linear(x), x)

    def on_train_end(self) -> None:
        self.loader_info["done"] = self.trainer.train_dataloader.stats().done

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=("ddp", "save", "resume"), required=True)
    p.add_argument("--devices", type=int, required=True)
    args = p.parse_args()
    elastic = args.phase != "ddp"
    model = Model(elastic, resize_at=2 if args.phase == "ddp" else None)
    ckpt = args.out / "mid-epoch.ckpt"
    # the checkpoint a run writes every 4 steps, mid-epoch (this run then stops, as if killed)
    every = ModelCheckpoint(
        dirpath=args.out, filename="mid-epoch", every_n_train_steps=4, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_epochs=1,
        max_steps=4 if args.phase == "save" else -1,
        use_distributed_sampler=not elastic,
        callbacks=[DeclareEpochs(), *([every] if args.phase == "save" else [])],
        enable_checkpointing=args.phase == "save",
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(model, ckpt_path=str(ckpt) if args.phase == "resume" else None)
    report = {"seen": model.seen, "loader": model.loader_info, "weight": model.linear.weight.item()}
    (args.out / f"{args.phase}.rank{trainer.global_rank}.json").write_text(json.dumps(report))
    end_ranks()


if __name__ == "__main__":
    main()
