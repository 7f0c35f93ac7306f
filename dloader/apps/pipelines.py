"""Real data pipelines for the testbed: per-sample costs that vary, as on real jobs.

* :class:`JpegImages`: JPEG files of varied sizes decoded from disk with Pillow, then a random
  resized crop to 224 x 224, a random horizontal flip and per-channel normalisation (what an
  ImageNet training loader does). The files are an ImageNet-like set generated once into a cache
  folder (:func:`make_jpegs`).
* :class:`PackedText`: documents of varied length tokenised (a regex split and a hashed
  vocabulary) and packed into fixed-length sequences, as language-model loaders do.
* :class:`RemoteReads`: reads from remote storage: a latency with jitter (log-normal) and
  occasional slow reads (a tail), then a little CPU to parse the payload.

The accelerator stays emulated (:mod:`dloader.apps.testbed`'s step model). Pillow is needed for the
image pipeline only (``pip install "dloader-elastic[bench]"``).
"""

from __future__ import annotations

import math
import random
import re
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dloader._shared import env

__all__ = [
    "JPEGS",
    "JpegImages",
    "PackedText",
    "RemoteReads",
    "default_cache",
    "jpeg_files",
    "make_jpegs",
    "read_through",
]

JPEGS = 3000
"""How many JPEG files the image pipeline reads unless told (the testbed's ``--jpegs``)."""

_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def default_cache() -> Path:
    """Where the generated JPEGs are kept (``$DLOADER_CACHE/jpegs``; see
    :mod:`dloader._shared.env`)."""
    return env.cache_dir() / "jpegs"


def make_jpegs(folder: Path, count: int = JPEGS, seed: int = 0) -> list[Path]:
    """An ImageNet-like set of ``count`` JPEGs (sizes 160-640 px a side, quality 85-95, smooth
    colour fields plus noise, so that they compress and decode like photos), written once:
    files already there are kept. Returns their paths, sorted."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        path = folder / f"img_{i:06d}.jpg"
        paths.append(path)
        w, h = (int(x) for x in rng.integers(160, 641, size=2))
        q = int(rng.integers(85, 96))
        if path.exists():
            continue
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        phase = rng.uniform(0, 2 * math.pi, size=3)
        freq = rng.uniform(0.005, 0.05, size=3)
        img = np.stack(
            [127 + 100 * np.sin(freq[c] * xx + phase[c]) * np.cos(freq[c] * yy) for c in range(3)],
            axis=-1,
        )
        img += rng.normal(0, 12, size=img.shape)
        tmp = path.with_suffix(".tmp")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(tmp, "JPEG", quality=q)
        tmp.replace(path)
    return paths


def jpeg_files(count: int = JPEGS) -> list[Path]:
    """The ``count`` JPEGs kept in :func:`default_cache` (generated there once)."""
    return make_jpegs(default_cache() / str(count), count)


def read_through(paths: Iterable[Path], chunk: int = 1 << 20) -> int:
    """Reads every file once, to its end, so that the page cache holds them; returns the bytes
    read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while block := f.read(chunk):
                total += len(block)
    return total


class JpegImages(Dataset[Any]):
    """Decode, random-resized-crop (scale 0.08-1, ratio 3/4-4/3), flip, normalise; returns a
    ``3 x size x size`` float tensor and the file index. ``normalise=False``: the crop as a
    ``uint8`` tensor, a quarter of the bytes, for the accelerator to normalise (what a loader
    whose batches cross a network sends)."""

    def __init__(
        self, paths: list[Path], length: int | None = None, size: int = 224, normalise: bool = True
    ) -> None:
        if not paths:
            raise ValueError("JpegImages needs at least one file")
        self.paths = [str(p) for p in paths]
        self.length = length or len(paths)
        self.size = size
        self.normalise = normalise

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        i = index % len(self.paths)
        rng = random.Random(index)
        with Image.open(self.paths[i]) as im:
            img = im.convert("RGB")
        w, h = img.size
        area = w * h
        for _ in range(10):
            target = area * rng.uniform(0.08, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
                break
        else:
            cw = ch = min(w, h)
            x, y = (w - cw) // 2, (h - ch) // 2
        img = img.resize(
            (self.size, self.size), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch)
        )
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if not self.normalise:
            return torch.from_numpy(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy()), i
        arr = (np.asarray(img, dtype=np.float32) - _MEAN) / _STD
        return torch.from_numpy(arr.transpose(2, 0, 1).copy()), i


_WORDS = re.compile(r"\w+|[^\w\s]")


class PackedText(Dataset[torch.Tensor]):
    """Each sample: documents of log-normal length (median ~300 words) generated from a Zipf
    vocabulary, tokenised and packed, with end-of-document tokens, into one ``seq_len``
    sequence of token ids."""

    def __init__(self, length: int, seq_len: int = 512, vocab: int = 32000) -> None:
        self.length, self.seq_len, self.vocab = length, seq_len, vocab
        rng = np.random.default_rng(1)
        letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
        self.lexicon = [
            "".join(rng.choice(letters, size=int(rng.integers(1, 11)))) for _ in range(5000)
        ]
        weights = 1 / np.arange(1, len(self.lexicon) + 1)
        self.cdf = np.cumsum(weights / weights.sum())

    def __len__(self) -> int:
        return self.length

    def _document(self, rng: np.random.Generator) -> str:
        n = int(min(rng.lognormal(math.log(300), 0.8), 4000))
        idx = np.searchsorted(self.cdf, rng.random(n))
        words = [self.lexicon[min(int(j), len(self.lexicon) - 1)] for j in idx]
        for k in range(12, len(words), 17):
            words[k] += "."
        return " ".join(words)

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = np.random.default_rng(index)
        out: list[int] = []
        while len(out) < self.seq_len:
            for token in _WORDS.findall(self._document(rng)):
                out.append(zlib.crc32(token.encode()) % (self.vocab - 1) + 1)
            out.append(0)  # end of document
        return torch.tensor(out[: self.seq_len], dtype=torch.int32)


class RemoteReads(Dataset[torch.Tensor]):
    """A read from remote storage: log-normal latency (median ``latency_ms``, sigma 0.5), one
    read in ``1 / slow_share`` takes ``slow_ms``; then the payload is checksummed (a little
    CPU)."""

    def __init__(
        self,
        length: int,
        latency_ms: float = 8.0,
        slow_share: float = 0.02,
        slow_ms: float = 120.0,
        payload_bytes: int = 64 * 1024,
    ) -> None:
        self.length = length
        self.latency_ms, self.slow_share, self.slow_ms = latency_ms, slow_share, slow_ms
        self.payload = bytes(np.random.default_rng(2).integers(0, 256, payload_bytes, np.uint8))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = random.Random(index)
        wait = self.slow_ms if rng.random() < self.slow_share else 0.0
        wait += self.latency_ms * math.exp(rng.gauss(0.0, 0.5))
        time.sleep(wait / 1000.0)
        return torch.tensor([zlib.crc32(self.payload), index], dtype=torch.int64)
