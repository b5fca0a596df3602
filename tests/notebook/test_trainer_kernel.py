"""🤗 Transformers' ``Trainer`` launched from a notebook cell as it is written for ``accelerate
launch``, through a real Jupyter kernel: the launch view shows its progress bar as a row and
what it logs as charts, and the kernel's own Trainer is left as it was."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_notebook
from widget_models import label_texts, shown_models

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="needs transformers"
    ),
]

#: A notebook's usual cell: Transformers imported in the kernel, the function defined in the cell.
TRAIN = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from nb_accel import notebook_launcher

class Counting(torch.utils.data.Dataset):
    def __init__(self, size):
        starts = torch.randint(0, 50, (size, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (starts + torch.arange(12)) % 100
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(12, dtype=torch.long),
                "labels": self.ids[i]}

def train(folder):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(output_dir=folder, per_device_train_batch_size=4, num_train_epochs=1,
                             learning_rate=1e-2, logging_steps=1, eval_strategy="epoch",
                             save_strategy="no", report_to=[], dataloader_pin_memory=False)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args,
                      train_dataset=Counting(32), eval_dataset=Counting(8))
    return trainer.train().global_step

print("global steps:", notebook_launcher(train, args=(FOLDER,), num_processes=2))
"""
KERNEL_TRAINER = """
import sys
import transformers.trainer as kernel_trainer
print("kernel:", kernel_trainer.DEFAULT_PROGRESS_CALLBACK.__name__,
      [c.__name__ for c in kernel_trainer.DEFAULT_CALLBACKS],
      [type(f).__module__ for f in sys.meta_path if type(f).__module__.startswith("nb_accel")])
"""
#: ``TrainingArguments`` made in the kernel (which sets them up for its one process) and passed
#: to the launched function.
ARGUMENTS_FROM_THE_KERNEL = """
made_here = TrainingArguments(output_dir=FOLDER, per_device_train_batch_size=4,
                              num_train_epochs=1, save_strategy="no", report_to=[],
                              dataloader_pin_memory=False)

def train_with(args):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Counting(32))
    steps = trainer.train().global_step
    return steps, args.world_size, args.process_index, args.should_save, args.device.type

print("made in the kernel:", notebook_launcher(train_with, args=(made_here,), num_processes=2))
print("in the kernel:", made_here.world_size, made_here.process_index, made_here.should_save)
"""
#: The series a launch view's chart draws, in the HTML of its widget.
SERIES = re.compile(r'<script type="application/json" class="nb-accel-series">(.*?)</script>', re.S)


@pytest.fixture(autouse=True)
def kernel_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launches' scratch goes under ``tmp_path``."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def _text(cell: NotebookNode) -> str:
    return "".join(
        str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs
    )


def test_the_trainer_s_progress_and_losses_show_in_the_launch_view(tmp_path: Path) -> None:
    cells = [
        new_code_cell(TRAIN.replace("FOLDER", repr(str(tmp_path / "out")))),
        new_code_cell(KERNEL_TRAINER),
    ]
    notebook = new_notebook(cells=cells)
    NotebookClient(notebook, timeout=240, kernel_name="python3", store_widget_state=True).execute()
    launch, kernel = notebook.cells
    text = _text(launch)
    assert "Launching 2 processes on CPU (gloo; fork)" in text
    assert "global steps: [4, 4]" in text  # 32 sequences, 4 per process and step: 8 alone
    assert "IPython.core.display" not in text  # no notebook progress that a worker cannot show
    shown = shown_models(notebook, launch)
    labels = label_texts(shown)
    assert "rank 0" in labels and "rank 1" in labels, labels
    assert any("4/4" in label for label in labels), labels  # the Trainer's bar, on rank 0
    bars = [m["state"] for m in shown if m["model_name"] == "FloatProgressModel"]
    assert any((b["value"], b["max"], b["bar_style"]) == (4, 4, "success") for b in bars), bars
    charts = [SERIES.search(str(m["state"].get("value", ""))) for m in shown]
    (series,) = [json.loads(found.group(1)) for found in charts if found]
    assert [step for step, _ in series["loss"]] == [1, 2, 3, 4]
    assert [step for step, _ in series["learning_rate"]] == [1, 2, 3, 4]
    assert [step for step, _ in series["eval_loss"]] == [4]
    assert "epoch" not in series and "train_runtime" not in series
    # the kernel's Trainer keeps the notebook's progress, its own callbacks and no finder
    assert "kernel: NotebookProgressCallback ['DefaultFlowCallback'] []" in _text(kernel)


def test_training_arguments_made_in_the_kernel_are_set_up_again_in_each_worker(
    tmp_path: Path,
) -> None:
    folder = repr(str(tmp_path / "out"))
    cells = [
        new_code_cell(TRAIN.split("print(")[0].replace("FOLDER", folder)),
        new_code_cell(ARGUMENTS_FROM_THE_KERNEL.replace("FOLDER", folder)),
    ]
    notebook = new_notebook(cells=cells)
    NotebookClient(notebook, timeout=240, kernel_name="python3").execute()
    text = _text(notebook.cells[1])
    # each rank its own: two processes, one main process that logs and saves, half the steps
    assert "made in the kernel: [(4, 2, 0, True, 'cpu'), (4, 2, 1, False, 'cpu')]" in text
    assert "in the kernel: 1 0 True" in text  # the kernel's own are left as they were
