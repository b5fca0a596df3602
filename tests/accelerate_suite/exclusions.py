"""The tests of Accelerate's suite that nb_accel does not have to pass, each with the reason.

Only tests that read Accelerate's private internals belong here; the documentation's "Coming
from Accelerate" page names each one.
"""

from __future__ import annotations

#: Script test calls (``script: function``) and unit tests (``file: Class::test``) left out.
EXCLUDED: dict[str, str] = {}


def reason_excluded(test_id: str) -> str | None:
    """Why ``test_id`` is left out of the suite (``None`` when it is not)."""
    return EXCLUDED.get(test_id)
