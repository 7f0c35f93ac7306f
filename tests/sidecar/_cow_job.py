"""A job whose workers copy their trainer's memory as they read (copy-on-read), for the memory
tests: ``python -m tests.sidecar._cow_job PATHS SECONDS SIDECAR``.

Its dataset is a Python list of path strings. Reading a string writes its reference count, so
a forked worker copies each page of the list it reads from: item ``i`` reads the run of
``RUN`` paths from ``i`` on (the sampler shuffles), so each worker's private memory grows to
the list's size within seconds, and an epoch is as long as the list. Each item also waits
2 ms (remote storage): the job wants many workers."""

from __future__ import annotations

import sys
import time

from torch.utils.data import Dataset

import dloader

RUN = 256


class CopyOnRead(Dataset[int]):
    def __init__(self, paths: int) -> None:
        self.paths = [f"/data/train/n{i // 1300:08d}/{i:08d}.JPEG" for i in range(paths)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        time.sleep(0.002)
        return sum(len(p) for p in self.paths[i : i + RUN])


def main() -> None:
    paths, seconds, sidecar = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    loader = dloader.DataLoader(
        CopyOnRead(paths),
        batch_size=16,
        shuffle=True,
        num_workers=1,
        sidecar=sidecar,
        job_name="copy-on-read",
    )
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in loader:
            time.sleep(0.002)
            if time.monotonic() - t0 > seconds:
                break


if __name__ == "__main__":
    main()
