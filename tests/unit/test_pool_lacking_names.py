"""What a pool says a replaced rank lacks: the user's names a worker's namespace holds
(modules, dunder names and IPython's own left out), those the kept ranks hold that the new
ranks do not, and the note that names them."""

from __future__ import annotations

from nb_accel.launch.pool_ranks.notes import NAMES_CODE, lacking_names, lacking_note
from nb_accel.worker.process.pool_worker import run_code, user_names


def test_a_workers_names_are_the_users_own_in_the_order_they_were_set() -> None:
    space = {"__name__": "__main__", "accelerator": object(), "rank": 0, "world_size": 2}
    run_code(
        "import os\nmodel = 1\n_ = 2\n_i3 = 'x'\n_7 = 3\nIn = []\n_own = 4\nlr = 0.1", space, "c"
    )
    assert user_names(space) == ["accelerator", "rank", "world_size", "model", "_own", "lr"]
    assert "os" in space and "__builtins__" in space  # there, and left out
    assert run_code(NAMES_CODE, space, "names") == user_names(space)  # what the pool asks


def test_the_names_a_new_rank_lacks_come_with_the_ranks_that_hold_them() -> None:
    fresh = ["accelerator", "rank", "world_size"]
    held = {0: [*fresh, "model", "only0"], 1: fresh, 2: [*fresh, "model"]}
    lacking = lacking_names(held, [1])
    assert lacking == {"model": [0, 2], "only0": [0]}
    assert lacking_note([1], lacking) == (
        "Rank 1 is new: it lacks `model` that ranks 0, 2 hold and `only0` that rank 0 holds; "
        "run the cells that define them again."
    )
    assert lacking_note([1, 2], {}) == (
        "Ranks 1, 2 are new; the other ranks hold no variables they lack."
    )
    many = lacking_note([1], {f"v{i}": [0] for i in range(10)})
    assert many.startswith("Rank 1 is new: it lacks `v0`, `v1`") and "`v7` and 2 more that" in many
