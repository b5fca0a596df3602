"""The troubleshooting page covers every message nb_accel gives: each error and warning text the
package raises, warns, notes on an exception, prints on stderr or shows in the configuration
form has an entry on ``docs/troubleshooting.md``, and each exception and warning class it
defines is named in a heading there. A message or class added to the package without an entry
makes the first or third test fail; the last test shows that the checks do notice.

Messages are found in the source with :mod:`ast`: the first argument of every call to an
exception class (raised at once or built to be raised later), of ``warnings.warn``, of
``add_note``, of ``print(..., file=sys.stderr)``; a failed rank's ``WorkerFailure`` message;
the FSDP plugin's notes; module constants named ``*_NOTE``, ``note`` variables, and what
functions named ``*_note``, ``*problem*`` or ``*advice*`` return (and, for problems, file
under a name); the advice of worker-only classes. A message given as a variable, a parameter
or a helper's result is traced to the text assigned to it in its function, passed by its
callers (or its default), or returned by the helper.

Each literal stretch of a message (the text between two of its placeholders) of
:data:`MIN_FRAGMENT` characters or more must appear on the page, where messages are quoted
with ``<placeholders>``; a message with only shorter stretches must appear with its stretches
in order. What a user cannot meet is listed in :data:`NOT_USER_FACING`, and a message that
only passes on text made elsewhere in :data:`PASSED_ON`, each with its reason.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nb_accel"
PAGE = ROOT / "docs" / "troubleshooting.md"

#: The shortest literal stretch of a message that must be on the page (shorter ones, such as
#: ``", got "``, join placeholders and say nothing of their own).
MIN_FRAGMENT = 12

#: Messages a user cannot meet, by module and a piece of their text (placeholders written
#: ``{...}`` as in the f-string): checks of what nb_accel's own processes and calls hand each
#: other, each with why no user input reaches it.
NOT_USER_FACING: dict[tuple[str, str], str] = {
    ("launch/multinode/node_ranks.py", "the launch's elastic agent was not made"): (
        "the launcher makes the agent's run in start(), before the driver looks at the ranks"
    ),
    ("launch/multinode/node_ranks.py", "take no commands"): (
        "the driver sends commands only to ranks that outlive their command (keeps)"
    ),
    ("launch/xla/ranks.py", "take no commands"): (
        "the driver sends commands only to ranks that outlive their command (keeps)"
    ),
    ("launch/xla/ranks.py", "the XLA workers ended without reporting a result"): (
        "asked only when no rank failed and not every rank returned, which unexplained_end "
        "answers first"
    ),
    ("notebook/compat_widgets.py", "is not one of the view's colours"): (
        "the views colour their texts only with the palette's colours"
    ),
    ("notebook/compat_shell.py", "probe"): (
        "an exception formatted once, never raised, to see whether IPython shows its notes"
    ),
    ("_messages/events.py", "unexpected message on the event channel"): (
        "the kernel decodes events only its own workers send"
    ),
    ("_messages/commands.py", "unexpected message from the kernel"): (
        "a worker decodes messages only its own kernel sends"
    ),
    ("launch/failures/user_errors.py", "the exception to render is neither"): (
        "IPython asks an exception for its rendering only once it has put it in sys.last_value "
        "(and formats it itself should the hook fail)"
    ),
    ("launch/hosts/launcher.py", "a launch across hosts sends its call pickled"): (
        "the launcher always pickles the call for hosts before it gets here"
    ),
    ("launch/hosts/pool_ranks.py", "is not connected"): (
        "an OSError the pool catches, reporting the host's or rank's end instead"
    ),
    ("launch/pool.py", "the pool is already started"): (
        "WorkerPool is driven by the magics, which stop a pool before starting one"
    ),
    ("launch/pool.py", "the pool is not started: %distributed start"): (
        "the magics check that a pool runs (their own UsageError) before using it"
    ),
    ("launch/processes.py", "is not one of"): (
        "start_worker gets a start method the launch plan has already checked"
    ),
    ("runtime/device_backends/base.py", "leaves the optimizer step to the optimizer"): (
        "called only on backends that step optimizers themselves"
    ),
    ("runtime/data/loader_shard.py", "base_dataloader belongs to a loader"): (
        "read on the class by introspection (help, documentation tools), which skip it"
    ),
    ("runtime/rank_local.py", "no rank's stream is attached yet"): (
        "the worker attaches its streams before any user code runs"
    ),
    ("worker/process/entrypoint.py", "worker received unexpected start-up data"): (
        "a spawned worker reads what its own launcher wrote to it"
    ),
    ("worker/process/node_worker.py", "is not set: this function runs under torch's elastic"): (
        "torch's elastic agent, started by nb_accel, always sets these variables"
    ),
    ("worker/process/pool_worker.py", "unexpected message from the kernel during a command"): (
        "the pool's worker reads commands only its kernel sends"
    ),
    ("worker/process/pool_worker.py", "serve() runs inside a launched worker only"): (
        "the pool starts serve() as its launched function; it is not public"
    ),
    ("worker/process/spec.py", "an InheritedCall reaches forked workers only"): (
        "the launcher pickles the call for every start method but fork"
    ),
    ("runtime/xla/object_rows.py", "a payload cannot have"): (
        "sizes computed by nb_accel's own object collectives on XLA"
    ),
    ("runtime/xla/object_rows.py", "does not fit a row of"): (
        "sizes computed by nb_accel's own object collectives on XLA"
    ),
    ("worker/xla/main.py", "an nb_accel XLA worker must run in a process forked by"): (
        "the XLA launcher forks its workers itself"
    ),
    ("runtime/state.py", "{name}"): (
        "AcceleratorState answers a dunder lookup (copy, pickle) it has not got, as Python does"
    ),
    ("runtime/training/scheduler.py", "{name}"): (
        "the scheduler wrapper's guard while it is unpickled, before it has its scheduler"
    ),
}

#: Messages that only pass on text made elsewhere, with nothing of their own to quote, by
#: module (``""``: wherever it is traced to) and their whole text; each with where the text
#: comes from (quoted on the page where it is made, when it is nb_accel's).
PASSED_ON: dict[tuple[str, str], str] = {
    ("launch/driver/driver.py", "{REBUILT_NOTE}"): "the constant of launch/pool_ranks/notes.py",
    ("launch/driver/driver.py", "{STOPPED_NOTE}"): "the constant of launch/pool_ranks/notes.py",
    ("launch/driver/driver.py", "{replaced_note(dead, pids, took, ran)}"): (
        "what launch/pool_ranks/notes.py's replaced_note says"
    ),
    ("notebook/magic_flags.py", "{message} ({'; '.join(hints)})"): (
        "argparse's unrecognized-arguments message, with the flags meant"
    ),
    ("worker/process/folded_frames.py", "{type(exc)}"): (
        "traceback.TracebackException formats a worker's own exception"
    ),
    ("__main__.py", "error: {error}"): "python -m nb_accel config prints a ConfigError's message",
    ("notebook/debug_magic.py", "{str(ended)}"): "a RankEndedError's text, as a UsageError",
    ("worker/process/outcomes.py", "{message}"): (
        "CollectiveDeadline's text (worker/debugging/deadline.py), as the rank's TimeoutError"
    ),
    ("notebook/magics.py", "{str(ended)}"): "a RankEndedError's text, as a UsageError",
    ("config.py", "{'; '.join((f'{name}: {text}' for name, text in problems.items()))}"): (
        "Config.problems()'s texts, each quoted, joined"
    ),
    ("config.py", "{file}: {error}"): "a ConfigError's text with the file named",
    (
        "launch/placement/nodes.py",
        "{'; '.join((f'{name} {text}' for name, text in relevant.items()))}",
    ): ("Config.problems()'s texts for the multi-node options, joined"),
    ("launch/failures/verdict.py", "{event.message}"): "a worker's exception's own message",
    ("launch/failures/verdict.py", "{first.message}"): "a dead rank's record, made in _died",
    ("launch/failures/verdict.py", " {record.message}"): (
        "NCCL's watchdog's record (made in _watchdog_failure) after a timeout's message"
    ),
    (
        "launch/failures/verdict.py",
        "{''.join(('\\n' + part for part in (knock_on, summary) if part))}",
    ): ("the knock-on and other-failures lines, quoted where they are made"),
    ("launch/hosts/connections.py", "{note} (on host {self.host})"): (
        "a host's end_runs_left_open lines, with the host named"
    ),
    ("", "host {node.host}: {node.ended.problem}"): (
        "a host's node ended on its own LaunchError or rendezvous error, with the host named"
    ),
    ("launch/launchers/left_open_runs.py", "{note}"): "end_runs_left_open's say(...) lines",
    ("launch/multinode/node_meeting.py", "{problems[0]}"): (
        "a node's NodeNetwork.problem() text, exchanged between the nodes"
    ),
    ("launch/plan.py", "{note}"): "the plan's notes: FORK_FALLBACK_NOTE and the GPU advice",
    ("", "{'\\n'.join(blocks)}"): "the ranks' stacks, as faulthandler wrote their frames",
    ("notebook/tracebacks.py", "{error.msg}"): "Python's own SyntaxError message",
    ("runtime/checkpoint/contents.py", "{path}: {error}"): (
        "a data loader's resume error, with the checkpoint file named"
    ),
    ("worker/process/node_worker.py", "{self.store.get(_ABORT).decode()}"): (
        "the two-nodes-with-one-node_rank message another node wrote to the store"
    ),
}

#: How the names of exception classes from other libraries end (IPython's ``UsageError``).
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Warning")


@dataclass(frozen=True)
class Message:
    """One message found in the source.

    Attributes:
        module: its file, relative to the package (``"launch/plan.py"``).
        line: the line of the call that gives it.
        kind: ``"exception"``, ``"warning"``, ``"note"``, ``"stderr"``, ``"form"`` (the
            configuration form's error line), or ``"found"`` (text a helper makes for one).
        parts: its literal stretches and placeholders, in order: ``("", text)`` for a literal,
            ``("{", source)`` for a placeholder, ``("?", text)`` for a placeholder that is one
            of a few texts of the package's own (this form's choice).
    """

    module: str
    line: int
    kind: str
    parts: tuple[tuple[str, str], ...]

    @property
    def text(self) -> str:
        """The message with its placeholders as ``{source}``, whitespace collapsed."""
        return _normalised("".join(f"{{{value}}}" if tag else value for tag, value in self.parts))

    @property
    def fragments(self) -> list[str]:
        """Its literal stretches, and the texts chosen for its placeholders, that are long
        enough to be looked for on the page."""
        stretches, run = [], ""
        for tag, value in self.parts:
            if tag == "":
                run += value
            else:
                stretches += [run, value] if tag == "?" else [run]
                run = ""
        pieces = [piece for text in [*stretches, run] for piece in _FIELD.split(text)]
        found = [_comparable(piece).strip() for piece in pieces]
        return [text for text in found if len(text) >= MIN_FRAGMENT]

    def where(self) -> str:
        return f"nb_accel/{self.module}:{self.line}"


#: A ``str.format`` field in a template (``"... ({culprit}) ..."``): a placeholder too.
_FIELD = re.compile(r"\{[^{}]*\}")


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _comparable(text: str) -> str:
    """``text`` as a message and the page are compared: without backticks (Markdown's code
    marks on the page, a message's own quotes of code), whitespace collapsed."""
    return _normalised(text.replace("`", ""))


def page_text(markdown: str) -> str:
    """The page as its messages are compared: backslash escapes undone, backticks dropped,
    whitespace collapsed."""
    return _comparable(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown))


def _exception_classes(trees: dict[str, ast.Module]) -> dict[str, str]:
    """The exception and warning classes nb_accel defines: name -> module."""
    known = {
        name
        for name in dir(builtins)
        if isinstance(getattr(builtins, name), type)
        and issubclass(getattr(builtins, name), BaseException)
    }
    found: dict[str, str] = {}
    changed = True
    while changed:  # a class deriving from one of ours counts too
        changed = False
        for module, tree in trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in found:
                    bases = {_called_name(base) for base in node.bases}
                    if bases & (known | set(found)) or any(
                        name.endswith(_EXCEPTION_SUFFIXES) for name in bases if name
                    ):
                        found[node.name] = module
                        changed = True
    return found


def _called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_exception(name: str | None, ours: dict[str, str]) -> bool:
    if name is None:
        return False
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return True
    return name in ours or name.endswith(_EXCEPTION_SUFFIXES)


_Function = ast.FunctionDef | ast.AsyncFunctionDef
_Parts = tuple[tuple[str, str], ...]

#: The most forms one message is followed into (its placeholders' choices multiply).
_MAX_VARIANTS = 64


class _Source:
    """The package's modules, and what tracing a message needs to know of them."""

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        self.trees = trees
        #: Each node's innermost enclosing function, and each function's module (by ``id``).
        self.owners: dict[int, _Function] = {}
        self.module_of: dict[int, str] = {}
        #: Functions by name: in each module, and in the whole package.
        self.functions: dict[tuple[str, str], list[_Function]] = {}
        self.everywhere: dict[str, list[_Function]] = {}
        #: Module constants and class attributes, by module and name.
        self.constants: dict[tuple[str, str], list[ast.expr]] = {}
        self.attributes: dict[tuple[str, str], list[ast.expr]] = {}
        #: Every call, by the name called, with its module.
        self.calls: dict[str, list[tuple[ast.Call, str]]] = {}
        #: The forms of each expression traced so far, and those being traced now.
        self._known: dict[tuple[int, int], list[_Parts]] = {}
        self._tracing: set[tuple[int, int]] = set()
        for module, tree in self.trees.items():
            self._index(module, tree, None)
            for statement in tree.body:
                self._constant(module, statement, self.constants)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for statement in node.body:
                        self._constant(module, statement, self.attributes)

    def _index(self, module: str, node: ast.AST, function: _Function | None) -> None:
        for child in ast.iter_child_nodes(node):
            if function is not None:
                self.owners[id(child)] = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.module_of[id(child)] = module
                self.functions.setdefault((module, child.name), []).append(child)
                self.everywhere.setdefault(child.name, []).append(child)
            if isinstance(child, ast.Call) and (name := _called_name(child.func)):
                self.calls.setdefault(name, []).append((child, module))
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
            self._index(module, child, inner or function)

    @staticmethod
    def _constant(
        module: str, statement: ast.stmt, table: dict[tuple[str, str], list[ast.expr]]
    ) -> None:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    table.setdefault((module, target.id), []).append(statement.value)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.value is not None:
                table.setdefault((module, statement.target.id), []).append(statement.value)

    def messages(self, node: ast.expr, module: str) -> list[_Parts]:
        """Every form the message ``node`` (in ``module``) can take (an ``if`` gives two),
        without the empty ones (a helper's ``""``: no message)."""
        found = self._variants(node, module, self.owners.get(id(node)), 0)
        return [parts for parts in found if any(tag or value.strip() for tag, value in parts)]

    def _variants(
        self, node: ast.expr, module: str, scope: _Function | None, depth: int
    ) -> list[_Parts]:
        key = (id(node), id(scope))
        if key not in self._known:
            if key in self._tracing or depth > 12:  # a cycle, or too far: the placeholder
                return [(("{", ast.unparse(node)),)]
            self._tracing.add(key)
            try:
                self._known[key] = self._traced(node, module, scope, depth)
            finally:
                self._tracing.discard(key)
        return self._known[key]

    def _traced(
        self, node: ast.expr, module: str, scope: _Function | None, depth: int
    ) -> list[_Parts]:
        placeholder: list[_Parts] = [(("{", ast.unparse(node)),)]
        if isinstance(node, ast.Constant):
            return [(("", node.value),)] if isinstance(node.value, str) else []
        if isinstance(node, ast.JoinedStr):
            forms: list[_Parts] = [()]
            for value in node.values:
                if isinstance(value, ast.Constant):
                    choices: list[_Parts] = [(("", str(value.value)),)]
                else:
                    assert isinstance(value, ast.FormattedValue)
                    choices = self._placed(value.value, module, scope, depth)
                forms = [form + choice for form in forms for choice in choices][:_MAX_VARIANTS]
            return forms
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            lefts = self._variants(node.left, module, scope, depth + 1)
            rights = self._variants(node.right, module, scope, depth + 1)
            return [left + right for left in lefts for right in rights][:_MAX_VARIANTS]
        if isinstance(node, ast.IfExp):
            return self._variants(node.body, module, scope, depth + 1) + self._variants(
                node.orelse, module, scope, depth + 1
            )
        values: list[tuple[ast.expr, str, _Function | None]] = []
        if isinstance(node, ast.Name):
            values = self._assigned(node.id, module, scope)
        elif isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("self", "cls"):
            values = [(v, module, None) for v in self.attributes.get((module, node.attr), [])]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "format":  # TEMPLATE.format(...): the template's text
                return self._variants(node.func.value, module, scope, depth + 1)
            if node.func.attr == "get" and isinstance(node.func.value, ast.Dict):
                entries = [v for v in node.func.value.values if v is not None] + node.args[1:]
                values = [(v, module, scope) for v in entries]
        if isinstance(node, ast.Call) and not values:
            values = self._returned(_called_name(node.func), module)
        found = [
            form
            for value, at, inner in values
            for form in self._variants(value, at, inner, depth + 1)
        ]
        return found[:_MAX_VARIANTS] if found else placeholder

    def _placed(
        self, node: ast.expr, module: str, scope: _Function | None, depth: int
    ) -> list[_Parts]:
        """A placeholder's forms where it is traced to text of the package's own (a named
        constant, a piece of advice, the words a caller passes): each of that text's literal
        stretches as a choice (``"?"``), to be quoted on its own; else the placeholder."""
        forms = self._variants(node, module, scope, depth + 1)
        if not any(not tag and value.strip() for form in forms for tag, value in form):
            return [(("{", ast.unparse(node)),)]
        return [
            tuple(("?", value) if not tag else (tag, value) for tag, value in form)
            for form in forms
        ]

    def _returned(self, name: str | None, module: str) -> list[tuple[ast.expr, str, _Function]]:
        """What the helper ``name`` returns, if it returns text: the module's own helper, else
        the package's of that name."""
        if not name or name == "join":
            return []
        helpers = [h for h in self.functions.get((module, name), []) if _says_something(h)] or [
            h for h in self.everywhere.get(name, []) if _says_something(h)
        ]
        return [
            (statement.value, self.module_of[id(helper)], helper)
            for helper in helpers
            for statement in ast.walk(helper)
            if isinstance(statement, ast.Return) and statement.value is not None
        ]

    def _assigned(
        self, name: str, module: str, scope: _Function | None
    ) -> list[tuple[ast.expr, str, _Function | None]]:
        """What ``name`` is given in ``scope``: its assignments there (a ``for`` over a tuple
        gives each element), else, for a parameter, the arguments its callers pass, else the
        module's constant of that name."""
        found: list[tuple[ast.expr, str, _Function | None]] = []
        for node in ast.walk(scope) if scope is not None else ():
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                found.append((node.value, module, scope))
            elif (
                isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr))
                and isinstance(node.target, ast.Name)
                and node.target.id == name
                and node.value is not None
            ):
                found.append((node.value, module, scope))
            elif isinstance(node, ast.For):
                found += [(value, module, scope) for value in self._iterated(node, name, module)]
        if not found and scope is not None:
            found = self._passed(scope, name)
        if not found:
            found = [(v, module, None) for v in self.constants.get((module, name), [])]
        return found

    def _iterated(self, loop: ast.For, name: str, module: str) -> list[ast.expr]:
        """What ``loop`` gives ``name``: each element of a tuple or list it runs over, or
        each key or value of a module's dict it runs over the items of."""
        if isinstance(loop.target, ast.Name) and loop.target.id == name:
            if isinstance(loop.iter, (ast.Tuple, ast.List)):
                return list(loop.iter.elts)
        if (
            isinstance(loop.target, ast.Tuple)
            and len(loop.target.elts) == 2
            and isinstance(loop.iter, ast.Call)
            and isinstance(loop.iter.func, ast.Attribute)
            and loop.iter.func.attr == "items"
            and isinstance(loop.iter.func.value, ast.Name)
        ):
            names = [ast.unparse(target) for target in loop.target.elts]
            for table in self.constants.get((module, loop.iter.func.value.id), []):
                if name in names and isinstance(table, ast.Dict):
                    keys = [key for key in table.keys if key is not None]
                    return keys if names.index(name) == 0 else list(table.values)
        return []

    def _passed(
        self, function: _Function, name: str
    ) -> list[tuple[ast.expr, str, _Function | None]]:
        """The arguments the package's calls of ``function`` give its parameter ``name``."""
        positional = [a.arg for a in function.args.posonlyargs + function.args.args]
        if name not in positional + [a.arg for a in function.args.kwonlyargs]:
            return []
        method = int(bool(positional) and positional[0] in ("self", "cls"))
        index = positional.index(name) - method if name in positional else None
        found: list[tuple[ast.expr, str, _Function | None]] = []
        arguments = function.args
        defaults = dict(
            zip(
                positional[len(positional) - len(arguments.defaults) :],
                arguments.defaults,
                strict=True,
            )
        )
        defaults.update(
            (a.arg, d)
            for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
            if d is not None
        )
        if name in defaults:  # what it is when a call leaves it out
            found.append((defaults[name], self.module_of[id(function)], None))
        for call, module in self.calls.get(function.name, []):
            given = [k.value for k in call.keywords if k.arg == name]
            if not given and index is not None and 0 <= index < len(call.args):
                given = [call.args[index]]
            found += [(value, module, self.owners.get(id(call))) for value in given]
        return found


def _says_something(function: _Function) -> bool:
    """Whether ``function`` returns text of its own (a string or an f-string, maybe joined)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and node.value is not None:
            for inner in ast.walk(node.value):
                if isinstance(inner, ast.JoinedStr) or (
                    isinstance(inner, ast.Constant) and isinstance(inner.value, str) and inner.value
                ):
                    return True
    return False


def _to_stderr(call: ast.Call) -> bool:
    return any(
        keyword.arg == "file" and ast.unparse(keyword.value) == "sys.stderr"
        for keyword in call.keywords
    )


def _message_sources(tree: ast.Module, ours: dict[str, str]) -> Iterator[tuple[str, ast.expr, int]]:
    """``(kind, message expression, line)`` for each message the module gives (see the
    module's docstring for where messages are looked for)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            name = _called_name(node.func)
            first = node.args[0]
            if isinstance(first, ast.Starred):
                continue
            if ast.unparse(first).startswith("errno.") and len(node.args) > 1:
                first = node.args[1]  # OSError(errno.ENOSPC, message): the message
            if name in ("warn", "warning", "warning_once"):
                yield "warning", first, node.lineno
            elif name == "add_note":
                yield "note", first, node.lineno
            elif (name == "print" and _to_stderr(node)) or name == "say":
                yield "stderr", first, node.lineno
            elif name == "_say" and any(  # the configuration form's error line
                k.arg == "error" and ast.unparse(k.value) == "True" for k in node.keywords
            ):
                yield "form", first, node.lineno
            elif _is_exception(name, ours):
                yield "exception", first, node.lineno
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("notes.append")
            and node.args
            and isinstance(node.args[0], ast.Tuple)
            and len(node.args[0].elts) == 2
        ):  # (option, text): said as a warning naming the option
            yield "warning", node.args[0].elts[1], node.lineno
        if isinstance(node, ast.Call) and _called_name(node.func) == "WorkerFailure":
            given = [k.value for k in node.keywords if k.arg == "message"]
            if given or len(node.args) > 2:  # a failed rank's record: its message is shown
                yield "exception", given[0] if given else node.args[2], node.lineno
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "note" for t in targets):
                yield "found", node.value, node.lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.endswith("_note") or "problem" in node.name or "advice" in node.name:
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Return) and inner.value is not None:
                        yield "found", inner.value, inner.lineno
                    if (
                        "problem" in node.name
                        and isinstance(inner, ast.Assign)
                        and isinstance(inner.targets[0], ast.Subscript)
                    ):
                        yield "found", inner.value, inner.lineno
        if isinstance(node, ast.ClassDef):  # what to return instead of a worker-only object
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "_nb_accel_worker_only"
                    for t in statement.targets
                ):
                    yield "found", statement.value, statement.lineno
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name) and target.id.endswith("_NOTE"):
                    yield "note", statement.value, statement.lineno


def package_trees() -> dict[str, ast.Module]:
    """Every module of the package, parsed, by its path in the package."""
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def package_messages(trees: dict[str, ast.Module] | None = None) -> list[Message]:
    """Every message of ``trees`` (the package's modules), each form of it once."""
    source = _Source(package_trees() if trees is None else trees)
    ours = _exception_classes(source.trees)
    found: dict[tuple[str, _Parts], Message] = {}
    for module, tree in source.trees.items():
        for kind, expression, line in _message_sources(tree, ours):
            for parts in source.messages(expression, module):
                if kind == "found" and not any(not tag and value.strip() for tag, value in parts):
                    continue  # a helper's value that is no text of its own (a dict, a tuple)
                found.setdefault((module, parts), Message(module, line, kind, parts))
    return sorted(found.values(), key=lambda m: (m.module, m.line, m.text))


def _listed_in(message: Message, table: dict[tuple[str, str], str]) -> bool:
    """Whether ``table`` lists ``message``: its whole text, or a piece of it long enough to
    name it."""
    return any(
        module == message.module
        and (
            _normalised(piece) == message.text
            or (len(piece) >= MIN_FRAGMENT and _normalised(piece) in message.text)
        )
        for module, piece in table
    )


def _not_user_facing(message: Message) -> bool:
    return _listed_in(message, NOT_USER_FACING)


def _passed_on(message: Message) -> bool:
    return any(
        module in ("", message.module) and _normalised(text) == message.text
        for module, text in PASSED_ON
    )


def _pattern(message: Message) -> re.Pattern[str] | None:
    """For a message without a long literal stretch: its literal stretches in order, with
    anything short between them (a quoted placeholder); ``None`` when it has no word of its
    own."""
    runs, run = [], ""
    for tag, value in message.parts:
        if tag == "":
            run += value
        else:
            runs.append(run)
            run = ""
    runs = [_comparable(piece) for text in [*runs, run] for piece in _FIELD.split(text)]
    if not any(re.search(r"[A-Za-z]{3}", text) for text in runs):
        return None
    while not runs[0].strip():
        runs.pop(0)
    while not runs[-1].strip():
        runs.pop()
    runs[0], runs[-1] = runs[0].lstrip(), runs[-1].rstrip()
    return re.compile(".{1,80}?".join(re.escape(text) for text in runs))


def uncovered(messages: list[Message], page: str) -> list[str]:
    """What is wrong with ``page`` (Markdown) for ``messages``: each message it has no entry
    for, and each with nothing of its own to look for that is not listed."""
    text = page_text(page)
    problems = []
    for message in messages:
        if _not_user_facing(message):
            continue
        fragments = message.fragments
        if fragments:
            missing = [fragment for fragment in fragments if fragment not in text]
            if missing:
                problems.append(f"{message.where()}: {message.text!r} lacks {missing[0]!r}")
            continue
        pattern = _pattern(message)
        if pattern is not None:
            if not pattern.search(text):
                problems.append(f"{message.where()}: {message.text!r} is not quoted")
        elif not _passed_on(message):
            problems.append(
                f"{message.where()}: {message.text!r} has no text of its own to look for: "
                "trace it to its text, or list it in PASSED_ON"
            )
    return problems


def _headings(page: str) -> list[str]:
    return [line.lstrip("#").strip() for line in page.splitlines() if line.startswith("#")]


def unnamed_classes(classes: dict[str, str], page: str) -> list[str]:
    """The classes of ``classes`` (name -> module) that no heading of ``page`` names."""
    headings = page_text(" ".join(_headings(page)))
    return [
        f"{name} (nb_accel/{module})"
        for name, module in sorted(classes.items())
        if not re.search(rf"\b{re.escape(name)}\b", headings)
    ]


@pytest.mark.timeout(60)
def test_every_message_has_an_entry() -> None:
    problems = uncovered(package_messages(), PAGE.read_text())
    assert not problems, (
        f"{len(problems)} message(s) without an entry on {PAGE.name}:\n" + "\n".join(problems)
    )


@pytest.mark.timeout(60)
def test_every_listed_exception_is_still_given() -> None:
    messages = package_messages()
    for module, piece in NOT_USER_FACING:
        assert any(_listed_in(m, {(module, piece): ""}) for m in messages), (
            f"nb_accel/{module} gives no message with {piece!r} any more: take it off the list"
        )
    for module, text in PASSED_ON:
        assert any(module in ("", m.module) and m.text == _normalised(text) for m in messages), (
            f"nb_accel/{module or '*'} gives no message {text!r} any more: take it off the list"
        )


@pytest.mark.timeout(60)
def test_every_exception_class_has_a_heading() -> None:
    classes = _exception_classes(package_trees())
    assert "WorkerError" in classes and "FSDPOptionWarning" in classes
    missing = unnamed_classes(classes, PAGE.read_text())
    assert not missing, f"exception and warning classes with no heading on {PAGE.name}: {missing}"


@pytest.mark.timeout(60)
def test_the_checks_notice_what_is_missing() -> None:
    page = PAGE.read_text()
    messages = package_messages()
    # An entry taken off the page: its message is reported.
    quoted = next(m for m in messages if m.module == "launch/plan.py" and m.fragments)
    without = page_text(page).replace(quoted.fragments[-1], "")
    assert any(p.startswith(quoted.where()) for p in uncovered(messages, without))
    # A message without a long stretch, quoted around its placeholders, taken off too.
    short = next(m for m in messages if not m.fragments and _pattern(m) is not None)
    pattern = _pattern(short)
    assert pattern is not None
    without = pattern.sub("", page_text(page))
    assert any(p.startswith(short.where()) for p in uncovered(messages, without))
    # A message new to the package: reported until the page has it.
    new = ast.parse('raise ValueError(f"the frobnicator {name!r} is out of tune: retune it")')
    found = package_messages({"frobnicator.py": new})
    assert [m.fragments for m in found] == [["the frobnicator", "is out of tune: retune it"]]
    assert uncovered(found, page)
    assert not uncovered(found, page + "\n`the frobnicator <name> is out of tune: retune it`\n")
    # A class taken off its heading.
    assert not unnamed_classes({"WorkerDiedError": "errors.py"}, page)
    cut = [
        line for line in page.splitlines() if not line.startswith("#") or "WorkerDied" not in line
    ]
    assert unnamed_classes({"WorkerDiedError": "errors.py"}, "\n".join(cut))
