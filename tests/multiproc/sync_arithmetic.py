"""The gradient comparison of Accelerate's ``test_sync.py::test_distributed_sync``, on a chosen
dataset, recording the gradients instead of asserting on them.

Accelerate's test builds ``RegressionDataset(length=80)`` with no seed, so every run draws fresh
data, and then checks ``torch.allclose(param.grad, ddp_param.grad)`` with its default relative
tolerance (1e-5). The model's gradient sums 32 samples at once; DDP's averages two sums of 16.
When a gradient nearly cancels, those two orders of summation differ by more than 1e-5 of it.

Run with ``python -m torch.distributed.run --nproc_per_node=2 sync_arithmetic.py LIBRARY SEED
RESULT`` (Accelerate's own launch) or call :func:`record` under ``notebook_launcher``.
"""

from __future__ import annotations

import json
import sys
from copy import deepcopy
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

#: A dataset seed on which the check fails: the gradient of ``a`` sums to about -6e-5.
CANCELLING_SEED = 85
#: A dataset seed on which it passes.
PLAIN_SEED = 7


def record(library: str, seed: int) -> dict[str, Any]:
    """The in-sync iteration's gradients (model, DDP model) and ``allclose`` verdicts, with
    ``Accelerator`` taken from ``library`` (``"accelerate"`` or ``"nb_accel"``)."""
    if library == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import set_seed
    else:
        from nb_accel import Accelerator
        from nb_accel.utils import set_seed
    from accelerate.test_utils import RegressionDataset, RegressionModel

    accelerator = Accelerator(cpu=True)
    set_seed(42)
    model = RegressionModel()
    ddp_model = deepcopy(model)
    loader = DataLoader(RegressionDataset(length=80, seed=seed), batch_size=16)
    ddp_model, loader = accelerator.prepare(ddp_model, loader)
    ddp_input, ddp_target = next(iter(loader)).values()
    grads: list[list[float]] = []
    verdicts: list[bool] = []
    for iteration in range(2):  # as the test: accumulate locally, then synchronise
        full_input, full_target = accelerator.gather((ddp_input, ddp_target))
        accelerator.backward(F.mse_loss(model(full_input), full_target))
        if iteration == 0:
            with accelerator.no_sync(ddp_model):
                accelerator.backward(F.mse_loss(ddp_model(ddp_input), ddp_target))
        else:
            accelerator.backward(F.mse_loss(ddp_model(ddp_input), ddp_target))
        torch.manual_seed(1337 + iteration)
        ddp_input = ddp_input[torch.randperm(len(ddp_input))]
    for param, ddp_param in zip(model.parameters(), ddp_model.parameters(), strict=True):
        grads.append([param.grad.item(), ddp_param.grad.item()])
        verdicts.append(bool(torch.allclose(param.grad, ddp_param.grad)))
    return {"grads": grads, "allclose": verdicts}


if __name__ == "__main__":
    import os

    library, seed, result = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    recorded = record(library, seed)
    with open(f"{result}.{os.environ['RANK']}", "w") as out:
        json.dump(recorded, out)
    # The group ends here, and the process without the interpreter's teardown: there torch's
    # threads may still be joinable and abort it ("terminate called without an active
    # exception") after its records are written.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
