"""Run under torchrun (2 CPU processes): accelerate's own loader vs dloader's adapter.

Each process writes ``<out>/rank<R>.json`` with what it saw; tests/integrations/test_frameworks.py
compares them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import Dataset, IterableDataset

import dloader
from dloader.integrations.accelerate import prepare

sys.path.insert(0, os.getcwd())  # torchrun runs in the repository root

from tests.integrations import end_ranks


class Indices(Dataset[torch.Tensor]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Any:
        return (torch.tensor(i) for i in range(21))


def batches(loader: Any, limit: int | None = None) -> list[list[int]]:
    out = []
    for b in loader:
        out.append(b.tolist())
        if limit is not None and len(out) == limit:
            break
    return out


def torch_run(acc: Accelerator, n: int, bs: int, drop_last: bool, seed: int) -> list[Any]:
    torch.manual_seed(seed)
    loader = acc.prepare(
        torch.utils.data.DataLoader(Indices(n), batch_size=bs, shuffle=True, drop_last=drop_last)
    )
    return [batches(loader) for _ in range(2)]


def dloader_run(
    acc: Accelerator, n: int, bs: int, drop_last: bool, seed: int, workers: int
) -> tuple[list[Any], Any]:
    torch.manual_seed(seed)
    loader = dloader.DataLoader(
        Indices(n), batch_size=bs, shuffle=True, drop_last=drop_last, num_workers=workers
    )
    prepared = prepare(acc, loader)
    return [batches(prepared) for _ in range(2)], prepared


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seedable", action="store_true")
    p.add_argument("--phase", choices=("compare", "save", "load"), default="compare")
    args = p.parse_args()
    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable)
    )
    rank = acc.process_index
    out = args.out / f"{args.phase}.rank{rank}.json"
    if args.phase != "compare":
        out.write_text(json.dumps(resume(acc, args.out / "ckpt", args.phase)))
        end_ranks()
        return
    report: dict[str, Any] = {"world": acc.num_processes, "cases": []}

    for n, bs, drop_last, workers in ((50, 4, False, 2), (50, 4, True, 0), (7, 4, False, 1)):
        expected = torch_run(acc, n, bs, drop_last, seed=11)
        got, prepared = dloader_run(acc, n, bs, drop_last, seed=11, workers=workers)
        report["cases"].append(
            {
                "n": n,
                "bs": bs,
                "drop_last": drop_last,
                "accelerate": expected,
                "dloader": got,
                "is_dloader": isinstance(prepared, dloader.DataLoader),
                "len": len(prepared),
            }
        )

    # An iterable dataset: accelerate's IterableDatasetShard inside a dloader loader. (Accelerate
    # dispatches iterable datasets' batches from rank 0 by default; dloader's workers load on
    # every rank, as accelerate's dispatch_batches=False.)
    own = prepare_data_loader(
        torch.utils.data.DataLoader(Stream(), batch_size=4),
        num_processes=acc.num_processes,
        process_index=acc.process_index,
        dispatch_batches=False,
    )
    mine = prepare(acc, dloader.DataLoader(Stream(), batch_size=4))
    report["iterable"] = {"accelerate": batches(own), "dloader": batches(mine)}

    # skip_first_batches through the Accelerator, as the HF Trainer resumes.
    torch.manual_seed(3)
    loader = prepare(acc, dloader.DataLoader(Indices(40), batch_size=4, shuffle=True))
    skipped = acc.skip_first_batches(loader, 3)
    report["skip"] = {"same_loader": skipped is loader, "batches": batches(skipped)}

    # A batch-size change applied by both processes at the same batch, and a live resize.
    torch.manual_seed(5)
    loader = prepare(
        acc,
        dloader.DataLoader(
            Indices(64), batch_size=4, shuffle=True, num_workers=2, max_workers=3, prefetch_factor=1
        ),
    )
    seen, it = [], iter(loader)
    for i, b in enumerate(it):
        seen.append(b.tolist())
        if i == 1:
            loader.set_batch_size(8, at_batch=4)
            loader.resize(1)
    report["changed"] = {"batches": seen, "workers": loader.num_workers}
    # gradient accumulation sees the end of the loader before its last batch
    ends = []
    for _ in batches_iter(loader):
        ends.append(acc.gradient_state.end_of_dataloader)
    report["ends"] = ends

    out.write_text(json.dumps(report))
    end_ranks()


def resume(acc: Accelerator, ckpt: Path, phase: str) -> dict[str, Any]:
    """``save``: 3 batches, ``accelerator.save_state``, then the rest of the epoch. ``load``: a
    new run (another seed) that loads the state: the rest of the epoch, exactly."""
    torch.manual_seed(3 if phase == "save" else 99)
    model = torch.nn.Linear(1, 1)
    loader = dloader.DataLoader(Indices(40), batch_size=4, shuffle=True, num_workers=2)
    model, loader = prepare(acc, model, loader)
    if phase == "load":
        acc.load_state(str(ckpt))
        return {"restored": batches(loader), "next_epoch": batches(loader)}
    it = iter(loader)
    first = [next(it).tolist() for _ in range(3)]
    acc.save_state(str(ckpt))
    return {"first": first, "rest": [b.tolist() for b in it], "next_epoch": batches(loader)}


def batches_iter(loader: Any) -> Any:
    yield from loader


if __name__ == "__main__":
    main()
