"""Re-exports of the names Accelerate's documentation places under ``accelerate.utils``, and,
in the submodules, where ``accelerate.utils.constants``, ``.dataclasses``, ``.operations``,
``.random``, ``.memory``, ``.imports``, ``.environment``, ``.modeling``, ``.fsdp_utils`` and
``.other`` have them.

Replacing ``accelerate`` by ``nb_accel`` in a user's imports is the whole migration.
"""

from . import (
    constants,
    dataclasses,
    environment,
    fsdp_utils,
    imports,
    memory,
    modeling,
    operations,
    other,
    random,
)
from .constants import *  # noqa: F403
from .dataclasses import *  # noqa: F403
from .environment import *  # noqa: F403
from .fsdp_utils import *  # noqa: F403
from .imports import *  # noqa: F403
from .memory import *  # noqa: F403
from .modeling import *  # noqa: F403
from .operations import *  # noqa: F403
from .other import *  # noqa: F403
from .random import *  # noqa: F403

__all__ = [
    *constants.__all__,
    *dataclasses.__all__,
    *environment.__all__,
    *fsdp_utils.__all__,
    *imports.__all__,
    *memory.__all__,
    *modeling.__all__,
    *operations.__all__,
    *other.__all__,
    *random.__all__,
]
