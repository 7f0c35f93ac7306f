"""Dataset metadata that forked workers do not copy: strings in two numpy arrays.

A forked worker shares its parent's memory until a page is written. Reading a Python object
writes to it (its reference count), so a worker that reads ``paths[i]`` from a list of 3M path
strings copies, page by page, the pages those strings live on: the copies grow over the epoch,
once per worker. :class:`StringArray` keeps the strings as one UTF-8 byte buffer and one offset
array, two objects whatever the count: reading item ``i`` builds a new ``str`` from a slice and
writes nothing in the shared pages, so workers stay at a few MB each (``benchmarks/
bench_memory.py`` measures both).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["StringArray"]


class StringArray(Sequence[str]):
    """An immutable sequence of strings stored in two numpy arrays (bytes and offsets).

    A drop-in for a list of paths, captions or labels held by a ``Dataset``::

        class Images(Dataset):
            def __init__(self, paths):
                self.paths = dloader.StringArray(paths)   # not list(paths)

    Indexing with an int gives a ``str``; with a slice, another ``StringArray``. It pickles as
    its two arrays (workers started by spawn or forkserver get one compact copy each).
    """

    __slots__ = ("_data", "_offsets")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        encoded = []
        for i, s in enumerate(strings):
            if not isinstance(s, str):
                raise TypeError(f"StringArray holds str; item {i} is {type(s).__name__}: {s!r}")
            encoded.append(s.encode("utf-8", "surrogatepass"))
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._offsets[1:])
        self._data = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    @classmethod
    def _of(cls, data: np.ndarray, offsets: np.ndarray) -> StringArray:
        out = cls.__new__(cls)
        out._data, out._offsets = data, offsets
        return out

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> StringArray: ...

    def __getitem__(self, index: int | slice) -> str | StringArray:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return StringArray([self[i] for i in range(start, stop, step)])
            lo, hi = int(self._offsets[start]), int(self._offsets[max(stop, start)])
            return StringArray._of(
                self._data[lo:hi], self._offsets[start : max(stop, start) + 1] - lo
            )
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"StringArray index {index} out of range for length {n}")
        lo, hi = self._offsets[i], self._offsets[i + 1]
        return self._data[lo:hi].tobytes().decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    @property
    def nbytes(self) -> int:
        """Bytes held (both arrays)."""
        return int(self._data.nbytes + self._offsets.nbytes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StringArray._of, (self._data, self._offsets))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return np.array_equal(self._offsets, other._offsets) and np.array_equal(
                self._data, other._data
            )
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking like a list: unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"StringArray([{head}{more}], len={len(self)}, nbytes={self.nbytes})"
