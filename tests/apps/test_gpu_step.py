"""The testbed's real training steps (``--device cuda``), run on the CPU here at a small size, in
float32 unless the CPU computes bf16 natively: the models train (loss falls on a repeated
batch), bf16 is used only where it is native, and the testbed refuses what it cannot run."""

from __future__ import annotations

import pytest
import torch

from dloader.apps import gpu_step, testbed


@pytest.mark.parametrize(
    "pipeline, batch",
    [
        ("jpeg", (torch.randn(4, 3, 224, 224), torch.arange(4))),
        ("text", torch.randint(0, 32000, (2, 64), dtype=torch.int32)),
    ],
)
def test_a_step_trains_its_model(
    pipeline: str, batch: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    losses: list[float] = []
    real = torch.Tensor.backward

    def record(self: torch.Tensor, *a: object, **k: object) -> None:
        losses.append(float(self.detach()))
        real(self, *a, **k)

    step = gpu_step.train_step(pipeline, "cpu", small=True)
    monkeypatch.setattr(torch.Tensor, "backward", record)
    for _ in range(4):
        step(batch)
    assert len(losses) == 4 and losses[-1] < losses[0], losses


def test_bf16_only_where_the_cpu_computes_it_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without AVX-512 BF16 or AMX (or one torch dispatches below AVX-512, as
    ``ATEN_CPU_CAPABILITY=avx2`` does) runs float32: emulated bf16 took 15-17 s a step there."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert gpu_step.autocast_dtype(cpu) is torch.bfloat16
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert gpu_step.autocast_dtype(cpu) is None
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert gpu_step.autocast_dtype(cpu) is None


def test_a_pipeline_without_a_model_is_refused() -> None:
    with pytest.raises(ValueError, match="pipeline='remote': a real model exists for"):
        gpu_step.train_step("remote", "cpu")


def test_the_testbed_refuses_cuda_where_it_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        testbed.main(["--profile", "io_heavy", "--device", "cuda"])
    assert (
        "a real model exists for image_jpeg and text_pack, not io_heavy" in capsys.readouterr().err
    )
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            testbed.main(["--profile", "text_pack", "--device", "cuda"])
        assert "torch sees no CUDA device" in capsys.readouterr().err
