"""Real training steps on a CUDA GPU, for the testbed's real pipelines (``--device cuda``).

With ``--device cuda`` a testbed job trains a real model on the batches its real pipeline makes,
instead of sleeping the emulated accelerator step:

* ``image_jpeg`` (3 x 224 x 224 images and their file index as label): ResNet-18 (torchvision's
  when it is installed, else a small convolutional network), channels-last, SGD with momentum;
* ``text_pack`` (512 packed token ids): a 6-layer transformer language model (width 512, 8
  heads, vocabulary 32,000), next-token loss, AdamW.

Both run under bf16 autocast where the device computes bf16 natively (:func:`autocast_dtype`:
a CUDA GPU that supports it; a CPU with AVX-512 BF16 or AMX that torch dispatches to), else in
float32: a CPU that only emulates bf16 takes 15-17 s for one step of the text model. ``small``
builds each model at a fraction of its size, for the CPU-only tests.

Each step copies the batch to the GPU (from pinned memory, ``non_blocking``), runs forward,
backward and the optimiser, and reads the loss back (``loss.item()``, as a training loop that
logs its loss does), so the step's wall time is the GPU's and the loader's wait is real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["PIPELINES", "autocast_dtype", "train_step"]

#: The pipelines with a real model.
PIPELINES = ("jpeg", "text")


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 where ``device`` computes it natively, else None (run in float32): a CUDA device
    that supports bf16; a CPU whose kernels torch dispatches at AVX-512 or above
    (``ATEN_CPU_CAPABILITY`` may lower that) and that has AVX-512 BF16 or AMX tiles."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type != "cpu":
        return None
    level = torch.backends.cpu.get_cpu_capability()
    native = [getattr(torch.cpu, f"_is_{x}_supported", None) for x in ("avx512_bf16", "amx_tile")]
    if level.startswith("AVX512") and any(f is not None and f() for f in native):
        return torch.bfloat16
    return None


def _image_model(small: bool) -> nn.Module:
    if not small:
        try:
            from torchvision.models import resnet18

            return resnet18(num_classes=1000)
        except ImportError:
            pass
    width = 16 if small else 64
    return nn.Sequential(
        nn.Conv2d(3, width, 7, stride=2, padding=3),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 1000),
    )


class _LanguageModel(nn.Module):
    def __init__(self, vocab: int = 32000, width: int = 512, layers: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        return self.head(self.body(self.embed(tokens), mask=mask, is_causal=True))


def train_step(
    pipeline: str, device: str = "cuda", *, small: bool = False
) -> Callable[[Any], None]:
    """One training step of ``pipeline``'s model on ``device``, as a callable taking a batch.
    Builds the model and runs one warm-up step on a zero batch (so the first timed step does
    not pay for CUDA's start-up). ``small``: a model a fraction of the size (tests on a CPU)."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline={pipeline!r}: a real model exists for {PIPELINES} only")
    dev = torch.device(device)
    model: nn.Module
    opt: torch.optim.Optimizer
    if pipeline == "jpeg":
        model = _image_model(small).to(dev, memory_format=torch.channels_last)  # type: ignore[call-overload]
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def loss_of(batch: Any) -> torch.Tensor:
            images, labels = batch
            x = images.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = labels.to(dev, non_blocking=True).remainder(1000)
            return nn.functional.cross_entropy(model(x), y)

        warm: Any = (torch.zeros(2, 3, 224, 224), torch.zeros(2, dtype=torch.int64))
    else:
        vocab = 1000 if small else 32000
        model = (_LanguageModel(vocab, 64, 2) if small else _LanguageModel(vocab)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def loss_of(batch: Any) -> torch.Tensor:
            tokens = batch.to(dev, non_blocking=True).long().remainder(vocab)
            logits = model(tokens[:, :-1])
            return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

        warm = torch.zeros(2, 64 if small else 512, dtype=torch.int32)

    dtype = autocast_dtype(dev)

    def step(batch: Any) -> None:
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()

    step(warm)
    return step
