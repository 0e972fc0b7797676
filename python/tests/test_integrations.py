"""The Lightning and Hugging Face callbacks, run locally (outside a cluster,
where xp's calls print and copy): they report the framework's metrics,
checkpoint through xp, and stop cleanly when xp asks. Skipped, saying why,
where the frameworks are not installed (CI does not install them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import xp
import xp._trial


@pytest.fixture
def local_xp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean local run: no node environment, xp's local files under tmp_path."""
    for name in list(os.environ):
        if name.startswith("XP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XP_LOCAL_DIR", str(tmp_path / "xp-local"))
    monkeypatch.chdir(tmp_path)
    xp._trial._local_stop.clear()
    yield tmp_path / "xp-local"
    xp._trial._local_stop.clear()


def test_the_lightning_callback_reports_checkpoints_and_stops(
    local_xp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed")
    from xp.integrations.lightning import CHECKPOINT_FILE, XpCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)

    def trainer(callback: XpCallback, epochs: int):
        return pl.Trainer(
            max_epochs=epochs,
            callbacks=[callback],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            log_every_n_steps=1,
        )

    callback = XpCallback(checkpoint_every_n_epochs=1)
    assert callback.resume_path() is None
    trainer(callback, 2).fit(Tiny(), loader)
    assert (local_xp / "checkpoint" / CHECKPOINT_FILE).exists()
    assert (local_xp / "checkpoint.step").read_text() == "8"
    assert "train_loss=" in capsys.readouterr().err

    # A resumed run starts from the stored checkpoint; asked to stop, it saves and stops.
    resumed = XpCallback(checkpoint_every_n_epochs=None)
    path = resumed.resume_path()
    assert path is not None and path.endswith(CHECKPOINT_FILE)
    xp._trial._local_stop.set()
    xp._trial._stop_watch_installed = True
    run = trainer(resumed, 4)
    run.fit(Tiny(), loader, ckpt_path=path)
    assert run.global_step == 9, "stopped after the first batch past the resumed step"
    assert (local_xp / "checkpoint.step").read_text() == "9"


def test_the_huggingface_callback_reports_checkpoints_and_stops(
    local_xp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from xp.integrations.huggingface import XpCallback, resume_checkpoint

    # A tiny model built from a config: nothing is downloaded.
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        num_labels=2,
    )
    generator = torch.Generator().manual_seed(0)
    rows = [
        {
            "input_ids": torch.randint(0, 32, (6,), generator=generator),
            "labels": torch.tensor(index % 2),
        }
        for index in range(16)
    ]

    def train(max_steps: int, resume: bool) -> "transformers.Trainer":
        args = transformers.TrainingArguments(
            output_dir=str(local_xp.parent / "out"),
            max_steps=max_steps,
            per_device_train_batch_size=4,
            logging_steps=1,
            save_steps=2,
            report_to=[],
            use_cpu=True,
        )
        trainer = transformers.Trainer(
            model=transformers.BertForSequenceClassification(config),
            args=args,
            train_dataset=rows,
            callbacks=[XpCallback()],
        )
        start = resume_checkpoint(args.output_dir) if resume else None
        trainer.train(resume_from_checkpoint=start)
        return trainer

    train(4, resume=False)
    assert (local_xp / "checkpoint.step").read_text() == "4"
    assert (local_xp / "checkpoint" / "trainer_state.json").exists()
    assert "loss=" in capsys.readouterr().err

    xp._trial._local_stop.set()
    xp._trial._stop_watch_installed = True
    trainer = train(8, resume=True)
    assert trainer.state.global_step == 5, "stopped one step past the resumed checkpoint"
    assert (local_xp / "checkpoint.step").read_text() == "5"
