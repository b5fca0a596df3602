"""What a launch with given options resolves to, read the way ``notebook_launcher`` reads them
(the saved configuration under ``NB_ACCEL_CONFIG_FILE``, the environment), nothing started."""

from __future__ import annotations

from typing import Any

from nb_accel.config import Config
from nb_accel.launch.plan import LaunchPlan
from nb_accel.launch.request import LaunchRequest
from nb_accel.launch.resolve import resolve_spec
from nb_accel.launch.spec import LaunchSpec


def spec_of(config: Config | None = None, pool: bool = False, **options: Any) -> LaunchSpec:
    """The spec of a launch (a pool's, with ``pool``) given ``options``."""
    return resolve_spec(LaunchRequest(**options), pool=pool, config=config)


def plan_of(config: Config | None = None, **options: Any) -> LaunchPlan:
    """The plan of one machine of a launch given ``options``."""
    return spec_of(config, **options).plan
