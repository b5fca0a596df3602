"""The quick tour of Accelerate's documentation, run as written but for the import."""

from __future__ import annotations

import torch

from nb_accel import notebook_launcher

QUICK_TOUR = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from nb_accel import Accelerator
from nb_accel.utils import set_seed

set_seed(0)
accelerator = Accelerator()

generator = torch.Generator().manual_seed(0)
inputs = torch.randn(96, 8, generator=generator)
targets = (inputs.sum(dim=1) > 0).long()
training_dataloader = DataLoader(TensorDataset(inputs, targets), batch_size=8, shuffle=True)
validation_dataloader = DataLoader(TensorDataset(inputs, targets), batch_size=16)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
loss_function = torch.nn.CrossEntropyLoss()

model, optimizer, training_dataloader, scheduler = accelerator.prepare(
    model, optimizer, training_dataloader, scheduler
)

for epoch in range(10):
    for source, targets_ in training_dataloader:
        optimizer.zero_grad()
        output = model(source)
        loss = loss_function(output, targets_)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()

validation_dataloader = accelerator.prepare(validation_dataloader)
all_predictions, all_targets = [], []
for inputs_, targets_ in validation_dataloader:
    with torch.no_grad():
        predictions = model(inputs_).argmax(dim=-1)
    predictions, targets_ = accelerator.gather_for_metrics((predictions, targets_))
    all_predictions.append(predictions)
    all_targets.append(targets_)

accelerator.wait_for_everyone()
with accelerator.main_process_first():
    accuracy = (torch.cat(all_predictions) == torch.cat(all_targets)).float().mean().item()
count = len(torch.cat(all_targets))
accelerator.print(f"accuracy {accuracy:.2f} on {count} samples")
"""


def run_quick_tour() -> tuple[float, int]:
    namespace: dict[str, object] = {}
    exec(compile(QUICK_TOUR, "quick_tour.py", "exec"), namespace)
    return namespace["accuracy"], namespace["count"]  # type: ignore[return-value]


def test_quick_tour_runs_on_two_processes() -> None:
    results = notebook_launcher(run_quick_tour, num_processes=2)
    (accuracy0, count0), (accuracy1, count1) = results
    assert count0 == count1 == 96  # gather_for_metrics returns exactly the dataset
    assert accuracy0 == accuracy1 > 0.9
    assert isinstance(torch.tensor(accuracy0), torch.Tensor)
