"""The test machines' one rule for where they cannot be made: a test that needs them skips,
saying why, except in CI (``CI`` set), where it fails; and every test file that needs root,
namespaces, sshd or SLURM goes through that rule instead of skipping on its own."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from machines import ip, require, unavailable

pytestmark = pytest.mark.timeout(60)

#: The modules that hold the rule (and this one, which names what it checks).
_RULE = {"machines.py", Path(__file__).name}
#: What marks a test file as needing the machines: it makes namespaces or uses the helpers.
_NEEDS_MACHINES = re.compile(r"netns|^from (machines|ssh_hosts|slurm_cluster) import", re.M)
#: Ways of skipping other than :func:`machines.unavailable`.
_OWN_SKIP = re.compile(r"pytest\.skip\(|skipif|importorskip|pytest\.mark\.skip\b")


def _ending(action: Callable[[], object]) -> type[BaseException]:
    """Whether ``action`` skipped or failed the test (it must do one of them)."""
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as info:
        action()
    return info.type


@pytest.mark.parametrize(
    "arguments",
    [("netns", "add", "no/such"), ("link", "add", "no/such", "type", "bridge")],
    ids=["ip netns add", "ip link add"],
)
def test_machines_that_cannot_be_made_fail_in_ci_and_skip_elsewhere(
    arguments: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("ip") is None:
        unavailable("needs ip")
    monkeypatch.setenv("CI", "true")  # `ip` itself refuses the name: a namespace or link fails
    assert _ending(lambda: ip(*arguments)) is pytest.fail.Exception
    assert _ending(lambda: require(["no-such-tool-for-the-machines"], [])) is pytest.fail.Exception
    monkeypatch.delenv("CI")
    assert _ending(lambda: ip(*arguments)) is pytest.skip.Exception
    assert _ending(lambda: require(["no-such-tool-for-the-machines"], [])) is pytest.skip.Exception


def test_every_test_that_needs_the_machines_skips_through_the_one_rule() -> None:
    here = Path(__file__).parent
    needing = [
        path
        for path in sorted(here.glob("*.py"))
        if path.name not in _RULE and _NEEDS_MACHINES.search(path.read_text())
    ]
    assert {"test_hosts_ssh.py", "test_multinode_network.py"} <= {p.name for p in needing}
    skipping = [path.name for path in needing if _OWN_SKIP.search(path.read_text())]
    assert skipping == [], f"skip only through machines.unavailable (CI fails): {skipping}"
