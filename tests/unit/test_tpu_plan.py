"""XLA launch planning from the runtime's facts: ranks, processes and threads per TPU
generation (as torch_xla's xmp.spawn runs them), and clear refusals of impossible counts."""

from __future__ import annotations

import pytest

from nb_accel.runtime.xla.tpu_plan import XlaFacts, XlaPlan, plan_xla, tpu_facts, tpu_generation


@pytest.mark.parametrize(
    ("accelerator_type", "generation"),
    [
        ("v2-8", 2),
        ("v3-8", 3),
        ("v3-32", 3),
        ("v4-8", 4),
        ("v5litepod-8", 5),
        ("v5p-8", 5),
        ("v6e-8", 6),
        (" V3-8 ", 3),
    ],
)
def test_generation_comes_from_the_accelerator_type(accelerator_type: str, generation: int) -> None:
    assert tpu_generation(accelerator_type, version=None) == generation
    # the accelerator type wins over a version read elsewhere
    assert tpu_generation(accelerator_type, version=9) == generation


@pytest.mark.parametrize("accelerator_type", [None, "", "tpu"])
def test_without_an_accelerator_type_torch_xla_version_decides(
    accelerator_type: str | None,
) -> None:
    assert tpu_generation(accelerator_type, version=3) == 3


def test_an_unknown_generation_is_refused_with_what_to_set() -> None:
    with pytest.raises(ValueError, match=r"TPU_ACCELERATOR_TYPE.*v3-8"):
        tpu_generation(None, version=None)


@pytest.mark.parametrize("accelerator_type", ["v2-8", "v3-8"])
def test_v2_and_v3_run_eight_ranks_as_four_processes_of_two_threads(
    accelerator_type: str,
) -> None:
    facts = tpu_facts(accelerator_type, version=None, processes=4)
    assert (facts.devices_per_process, facts.devices) == (2, 8)
    expected = XlaPlan(
        ranks=8,
        processes=4,
        threads_per_process=2,
        spawn_nprocs=None,
        where=f"TPU {accelerator_type}",
    )
    assert plan_xla(facts, None) == expected
    assert plan_xla(facts, 8) == expected
    assert expected.describe() == (
        f"8 ranks on TPU {accelerator_type} (4 processes, 2 threads each: one per TensorCore)"
    )


def test_a_v3_found_by_version_alone_runs_the_same_way() -> None:
    facts = tpu_facts(None, version=3, processes=4)
    assert plan_xla(facts, None).threads_per_process == 2
    assert plan_xla(facts, None).where == "TPU v3"


@pytest.mark.parametrize(
    ("accelerator_type", "chips"), [("v4-8", 4), ("v5litepod-8", 8), ("v6e-1", 1)]
)
def test_v4_and_later_run_one_process_and_one_rank_per_chip(
    accelerator_type: str, chips: int
) -> None:
    facts = tpu_facts(accelerator_type, version=None, processes=chips)
    plan = plan_xla(facts, None)
    assert (plan.ranks, plan.processes, plan.threads_per_process) == (chips, chips, 1)
    assert plan.spawn_nprocs is None
    assert plan_xla(facts, chips).ranks == chips


@pytest.mark.parametrize("accelerator_type", ["v2-8", "v3-8", "v5litepod-8"])
def test_one_process_runs_one_rank_on_the_first_device(accelerator_type: str) -> None:
    facts = tpu_facts(accelerator_type, version=None, processes=4)
    plan = plan_xla(facts, 1)
    assert (plan.ranks, plan.processes, plan.threads_per_process, plan.spawn_nprocs) == (1, 1, 1, 1)
    assert plan.describe() == f"1 process on TPU {accelerator_type}"


@pytest.mark.parametrize("asked", [2, 4, 16])
def test_an_impossible_count_on_a_v3_names_the_counts_that_work(asked: int) -> None:
    facts = tpu_facts("v3-8", version=None, processes=4)
    with pytest.raises(ValueError) as caught:
        plan_xla(facts, asked)
    message = str(caught.value)
    assert f"num_processes={asked}" in message
    assert "num_processes=8" in message and "num_processes=1" in message
    assert "4 chips with 2 TensorCores each" in message


def test_an_impossible_count_on_a_v4_names_one_rank_per_chip() -> None:
    facts = tpu_facts("v4-8", version=None, processes=4)
    with pytest.raises(ValueError, match=r"num_processes=8, .* either 1 rank or 4 \(4 chips"):
        plan_xla(facts, 8)


def test_cpu_devices_run_as_threads_of_one_process() -> None:
    facts = XlaFacts("CPU", processes=1, devices_per_process=2)
    plan = plan_xla(facts, None)
    assert (plan.ranks, plan.processes, plan.threads_per_process) == (2, 1, 2)
    assert plan.describe() == "2 ranks on CPU (1 process, 2 threads each: one per device)"
    with pytest.raises(ValueError, match="2 devices, run as threads of one process"):
        plan_xla(facts, 3)


def test_one_device_runs_one_rank() -> None:
    facts = XlaFacts("CPU", processes=1)
    assert plan_xla(facts, None) == XlaPlan(1, 1, 1, None, "CPU")
    with pytest.raises(ValueError, match=r"offers one XLA device.*num_processes=1"):
        plan_xla(facts, 2)


def test_unknown_facts_use_every_device() -> None:
    assert plan_xla(None, None) == XlaPlan(1, 1, 1, None, "XLA")
    assert plan_xla(None, 4).spawn_nprocs is None
