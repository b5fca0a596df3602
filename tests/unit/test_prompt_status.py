"""The kernel remembers the last prompt each rank showed (its debugger's or ``input()``'s, and
where), and a collective timeout that passed while a prompt was open says so of the ranks that
showed one during the command, instead of what they did after it was answered; a rank that
failed on its own, or a timeout with no prompt open, is said as before."""

from __future__ import annotations

import pytest

from nb_accel._messages import Failure, Prompt
from nb_accel.launch.debugging import prompts
from nb_accel.launch.failures.failure_log import FailureLog
from nb_accel.launch.launchers.outcome import RETURNED, failure_outcome

TIMEOUT = "Timed out after 2 s waiting in all_reduce #2 (the launch's collective timeout)"


def _answered(monkeypatch: pytest.MonkeyPatch, event: Prompt) -> list[bytes]:
    monkeypatch.setattr("builtins.input", lambda text: "c")
    sent: list[bytes] = []
    prompts.answer_prompt(event, lambda: None, sent.append)
    return sent


def test_the_last_prompt_of_each_rank_since_a_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    mark = prompts.prompts_shown()
    _answered(monkeypatch, Prompt(3, "[rank 3] name? ", where=("/src/train.py", 4, "ask")))
    pdb = Prompt(1, "(Pdb rank 1) ", debugger=True, where=("/src/train.py", 9, "train"))
    assert _answered(monkeypatch, pdb)  # answered
    later = prompts.prompts_shown()
    assert later == mark + 2
    shown = prompts.prompts_since(mark)
    assert shown[1].status() == "was at a pdb prompt, at `train` (train.py, line 9)"
    assert shown[3].status() == "was at an input() prompt, at `ask` (train.py, line 4)"
    assert prompts.prompts_since(later) == {}  # none shown since
    _answered(monkeypatch, Prompt(1, "(Pdb rank 1) ", debugger=True))
    assert prompts.prompts_since(later)[1].status() == "was at a pdb prompt"  # where unknown


def _timed_out(at_prompt: bool, *others: Failure) -> FailureLog:
    log = FailureLog()
    log.add_event(Failure(0, "builtins.TimeoutError", TIMEOUT, "", None, True, at_prompt=at_prompt))
    for other in others:
        log.add_event(other)
    return log


AT_PROMPT = {1: "was at a pdb prompt, at `train` (train.py, line 9)"}


def test_a_timeout_while_a_prompt_was_open_says_the_rank_was_there() -> None:
    error = failure_outcome(_timed_out(True), 2, 2.0, [1], prompts=AT_PROMPT)
    assert f"Rank 1 did not arrive ({AT_PROMPT[1]})." in str(error), error


def test_a_timeout_with_no_prompt_open_says_what_the_rank_did() -> None:
    error = failure_outcome(_timed_out(False), 2, 2.0, [1], prompts=AT_PROMPT)
    assert f"Rank 1 did not arrive ({RETURNED})." in str(error), error


def test_a_rank_whose_collective_failed_after_the_prompt_is_said_to_have_been_there() -> None:
    """A pool's rank goes on once answered, and its collective fails: the waiting rank gave up
    meanwhile (its connections shut down). It was at its prompt, not late."""
    lost = Failure(1, "builtins.RuntimeError", "Connection closed by peer [127.0.0.1]:1", "", None)
    error = failure_outcome(_timed_out(True, lost), 2, 2.0, [], prompts=AT_PROMPT, kept=True)
    assert f"Rank 1 did not arrive ({AT_PROMPT[1]})." in str(error), error


def test_a_rank_that_failed_on_its_own_is_said_to_have_failed() -> None:
    own = Failure(1, "builtins.ValueError", "bad batch", "", None)
    error = failure_outcome(_timed_out(True, own), 2, 2.0, [], prompts=AT_PROMPT)
    assert "pdb prompt" not in str(error) and "bad batch" in str(error), error
