"""dloader.StringArray: a list of strings that forked workers read without copying it."""

from __future__ import annotations

import os
import pickle

import psutil
import pytest
from torch.utils.data import Dataset

import dloader

WORDS = ["", "a", "ünïcödé", "path/to/img_0001.jpg", "\udcff-surrogate", "x" * 1000]


def test_behaves_like_a_list_of_str() -> None:
    arr = dloader.StringArray(WORDS)
    assert len(arr) == len(WORDS) and list(arr) == WORDS and arr == WORDS
    assert [arr[i] for i in range(-len(WORDS), 0)] == WORDS
    assert arr[1:4] == WORDS[1:4] and isinstance(arr[1:4], dloader.StringArray)
    assert arr[::2] == WORDS[::2] and arr[4:2] == [] and len(arr[4:2]) == 0
    assert pickle.loads(pickle.dumps(arr)) == arr
    assert dloader.StringArray() == [] and "len=6" in repr(arr)
    with pytest.raises(IndexError, match="index 6 out of range for length 6"):
        arr[6]
    with pytest.raises(TypeError, match="item 1 is int"):
        dloader.StringArray(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        hash(arr)


class Paths(Dataset[int]):
    """Reads every path (as a dataset's __getitem__ would); the last sample reports the worker's
    private memory (USS) growth since its start."""

    def __init__(self, paths: object, n: int) -> None:
        self.paths, self.n = paths, n
        self.start_uss = 0

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        me = psutil.Process(os.getpid())
        if i == 0:
            self.start_uss = me.memory_full_info().uss
            return 0
        total = 0
        for j in range(self.n):
            total += len(self.paths[j])  # type: ignore[index]
        return me.memory_full_info().uss - self.start_uss


def worker_growth(paths: object, n: int) -> int:
    loader = dloader.DataLoader(Paths(paths, n), batch_size=None, num_workers=1)
    return int(list(loader)[1])


@pytest.mark.integration
def test_forked_workers_do_not_copy_it() -> None:
    n = 300_000
    names = [f"/data/imagenet/train/n{i // 1300:08d}/img_{i:08d}.JPEG" for i in range(n)]
    copied = worker_growth(names, n)
    flat = worker_growth(dloader.StringArray(names), n)
    assert copied > 10 * 2**20, copied  # the list's pages were copied into the worker
    assert flat < 2 * 2**20, flat
    assert flat < copied / 10
