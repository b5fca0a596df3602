"""🤗 Transformers' ``Trainer``, written as for ``accelerate launch``, inside a launch: it trains
distributed (each process its share of every epoch), its progress bar is a row of the launch
view, what it logs reaches the live chart, and its failures reach the kernel like any other."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import nb_accel
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory
from nb_accel.worker.process.import_hooks import waiting_hooks

#: Transformers is imported by the workers only: the test process never loads it (nor would a
#: kernel that does not use it), so the suite's other tests see it unloaded.
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="needs transformers"
    ),
]

#: Sequences in the training set, tokens in each, sequences per process and step.
SEQUENCES, LENGTH, BATCH = 32, 12, 4


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)

    def points(self, rank: int) -> dict[str, list[tuple[int | None, float]]]:
        """Each metric ``rank`` logged, as ``(step, value)`` in order."""
        found: dict[str, list[tuple[int | None, float]]] = {}
        for report in self.reports:
            if report.rank == rank:
                for step, values in report.metrics:
                    for name, value in values.items():
                        found.setdefault(name, []).append((step, value))
        return found


class Counting(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sequences that count up from a random start (a language model learns them quickly);
    ``labels=False`` leaves the labels out."""

    def __init__(self, size: int, labels: bool = True) -> None:
        generator = torch.Generator().manual_seed(0)
        starts = torch.randint(0, 50, (size, 1), generator=generator)
        self.ids = (starts + torch.arange(LENGTH)) % 100
        self.labels = labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = {
            "input_ids": self.ids[index],
            "attention_mask": torch.ones(LENGTH, dtype=torch.long),
        }
        if self.labels:
            item["labels"] = self.ids[index]
        return item


def train(folder: str, labels_on_rank_1: bool = True) -> dict[str, Any]:
    """A tiny GPT-2 built from a config, trained for one epoch by the Trainer, evaluated once."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=100,
            n_positions=16,
            n_embd=32,
            n_layer=2,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    args = TrainingArguments(
        output_dir=folder,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        num_train_epochs=1,
        learning_rate=1e-2,
        logging_steps=1,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        disable_tqdm=False,
        dataloader_pin_memory=False,
    )
    labels = labels_on_rank_1 or args.process_index != 1
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Counting(SEQUENCES, labels=labels),
        eval_dataset=Counting(8),
    )
    result = trainer.train()
    return {
        "steps": result.global_step,
        "loss": result.training_loss,
        "first_loss": trainer.state.log_history[0]["loss"],
        "world_size": args.world_size,
        "type": trainer.accelerator.distributed_type.value,
        "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
    }


def _launch(recorder: Recorder, folder: Path, processes: int, start_method: str) -> list[Any]:
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        return nb_accel.notebook_launcher(
            train, args=(str(folder),), num_processes=processes, start_method=start_method
        )
    finally:
        register_view_factory(previous)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the Trainer did in a launch of one process."""
    (result,) = _launch(Recorder(), tmp_path_factory.mktemp("one"), 1, "fork")
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize("start_method", ["fork", "spawn"])  # spawn: transformers loaded late
def test_the_trainer_trains_on_every_process_and_reports_to_the_view(
    start_method: str, one_process: dict[str, Any], tmp_path: Path
) -> None:
    recorder = Recorder()
    results = _launch(recorder, tmp_path, 2, start_method)
    assert one_process["steps"] == SEQUENCES // BATCH and one_process["world_size"] == 1
    for result in results:
        assert result["type"] == "MULTI_CPU" and result["world_size"] == 2
        assert result["steps"] * 2 == one_process["steps"]  # each process half of the epoch
        assert math.isfinite(result["loss"])
        assert abs(result["first_loss"] - one_process["first_loss"]) < 0.5  # same scale
        assert "LiveChartCallback" in result["callbacks"]
        assert "ProgressCallback" in result["callbacks"]
    assert results[0]["loss"] == results[1]["loss"]  # the Trainer reduces it over the launch
    charted = recorder.points(0)
    steps = list(range(1, results[0]["steps"] + 1))
    assert [step for step, _ in charted["loss"]] == steps
    assert [step for step, _ in charted["learning_rate"]] == steps
    assert [step for step, _ in charted["grad_norm"]] == steps
    assert all(math.isfinite(value) for _, value in charted["loss"])
    assert [step for step, _ in charted["eval_loss"]] == [steps[-1]]
    assert charted["train_loss"] == [(steps[-1], pytest.approx(results[0]["loss"]))]
    assert not {"epoch", "train_runtime", "eval_runtime", "train_samples_per_second"} & set(charted)
    assert recorder.points(1) == {}  # the main process's logs only: they are the launch's
    bars = [bar for report in recorder.reports if report.rank == 0 for bar in report.bars]
    training = [bar for bar in bars if bar.closed and bar.total == results[0]["steps"]]
    assert training and training[-1].n == results[0]["steps"]  # its tqdm bar, a row of the view
    assert waiting_hooks() == {}  # nothing waits for transformers in this process
    assert not any(type(f).__module__.startswith("nb_accel") for f in sys.meta_path)
    assert "transformers" not in sys.modules


def test_a_failure_inside_the_trainer_keeps_its_type_rank_and_traceback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="did not return a loss") as caught:
        nb_accel.notebook_launcher(train, args=(str(tmp_path), False), num_processes=2)
    assert "rank 1" in "\n".join(getattr(caught.value, "__notes__", []))
    worker_traceback = str(caught.value.__cause__)
    assert "Traceback from rank 1" in worker_traceback
    assert "in compute_loss" in worker_traceback and "trainer.train()" in worker_traceback
