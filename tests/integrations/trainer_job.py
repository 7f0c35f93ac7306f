"""Run under torchrun (2 CPU processes): the Hugging Face Trainer with its own loader vs
DLoaderTrainer, a full run and a run stopped at a checkpoint then resumed.

Each process writes ``<out>/trainer.rank<R>.json``: the sample indices its model trained on,
step by step, in each run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

import dloader
from dloader.integrations.transformers import DLoaderTrainer

sys.path.insert(0, os.getcwd())  # torchrun runs in the repository root

from tests.integrations import end_ranks


class Indexed(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "idx": torch.tensor(i),
            "x": torch.tensor([float(i % 7)]),
            "labels": torch.tensor(1.0),
        }


class Recorder(torch.nn.Module):
    """Regression on x; remembers which sample indices each forward saw."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def forward(self, idx: torch.Tensor, x: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        if self.training:
            self.seen.append(idx.tolist())
        out = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def run(cls: type, out: Path, name: str, resume: bool = False, **overrides: Any) -> Any:
    torch.manual_seed(0)
    model = Recorder()
    settings: dict[str, Any] = dict(
        output_dir=str(out / name),
        per_device_train_batch_size=3,
        num_train_epochs=2,
        learning_rate=0.01,
        lr_scheduler_type="constant",  # the stopped run must not decay to 0 at its max_steps
        seed=17,
        use_cpu=True,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        dataloader_num_workers=1,
        disable_tqdm=True,
    )
    settings.update(overrides)
    extra = {"dloader_options": {"max_workers": 2}} if cls is DLoaderTrainer else {}
    trainer = cls(
        model=model, args=TrainingArguments(**settings), train_dataset=Indexed(38), **extra
    )
    trainer.train(resume_from_checkpoint=resume or None)
    loader = getattr(trainer, "train_loader", None)
    mine = isinstance(loader, dloader.DataLoader)
    done = loader.stats().done if mine else None  # type: ignore[union-attr]
    return model.seen, mine, model.linear.weight.item(), done


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    report: dict[str, Any] = {}
    report["torch"] = run(Trainer, args.out, "torch")
    report["dloader"] = run(DLoaderTrainer, args.out, "dloader")
    # stop at step 9 (mid-epoch 2) with a checkpoint, then a new Trainer resumes from it
    report["first"] = run(
        DLoaderTrainer, args.out, "resumed", max_steps=9, save_strategy="steps", save_steps=9
    )
    report["resumed"] = run(DLoaderTrainer, args.out, "resumed", resume=True)
    rank = torch.distributed.get_rank()
    (args.out / f"trainer.rank{rank}.json").write_text(json.dumps(report))
    end_ranks()


if __name__ == "__main__":
    main()
