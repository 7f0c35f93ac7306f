"""Real training steps on a CUDA GPU, for the testbed's real pipelines (``--device cuda``).

With ``--device cuda`` a testbed job trains a real model on the batches its real pipeline makes,
instead of sleeping the emulated accelerator step:

* ``image_jpeg`` (3 x 224 x 224 images and their file index as label): ResNet-18 (torchvision's
  when it is installed, else a small convolutional network), bf16 autocast, channels-last, SGD
  with momentum;
* ``text_pack`` (512 packed token ids): a 6-layer transformer language model (width 512, 8
  heads, vocabulary 32,000), next-token loss, bf16 autocast, AdamW.

Each step copies the batch to the GPU (from pinned memory, ``non_blocking``), runs forward,
backward and the optimiser, and reads the loss back (``loss.item()``, as a training loop that
logs its loss does), so the step's wall time is the GPU's and the loader's wait is real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["PIPELINES", "train_step"]

#: The pipelines with a real model.
PIPELINES = ("jpeg", "text")


def _image_model() -> nn.Module:
    try:
        from torchvision.models import resnet18

        return resnet18(num_classes=1000)
    except ImportError:
        return nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
            nn.Conv2d(64, 128, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(128, 256, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(256, 1000),
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


def train_step(pipeline: str, device: str = "cuda") -> Callable[[Any], None]:
    """One training step of ``pipeline``'s model on ``device``, as a callable taking a batch.
    Builds the model and runs one warm-up step on a zero batch (so the first timed step does
    not pay for CUDA's start-up)."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline={pipeline!r}: a real model exists for {PIPELINES} only")
    dev = torch.device(device)
    model: nn.Module
    opt: torch.optim.Optimizer
    if pipeline == "jpeg":
        model = _image_model().to(dev, memory_format=torch.channels_last)  # type: ignore[call-overload]
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def loss_of(batch: Any) -> torch.Tensor:
            images, labels = batch
            x = images.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = labels.to(dev, non_blocking=True).remainder(1000)
            return nn.functional.cross_entropy(model(x), y)

        warm: Any = (torch.zeros(2, 3, 224, 224), torch.zeros(2, dtype=torch.int64))
    else:
        model = _LanguageModel().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def loss_of(batch: Any) -> torch.Tensor:
            tokens = batch.to(dev, non_blocking=True).long()
            logits = model(tokens[:, :-1])
            return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

        warm = torch.zeros(2, 512, dtype=torch.int32)

    def step(batch: Any) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()

    step(warm)
    return step
