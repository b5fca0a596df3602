"""``DataLoaderDispatcher``: process 0 loads every batch and sends each process its slice.

Process 0 loads one *global* batch per step (``num_processes`` batches of the wrapped loader
fetched and collated together, or one batch with ``split_batches``), slices it and sends each
process its slice as one message (:mod:`~nb_accel.runtime.data.wire`) over a link: shared memory on
a single Linux machine (:mod:`~nb_accel.runtime.data.link_local`), else point-to-point messages
through the process group (:mod:`~nb_accel.runtime.data.link_gloo`). Sends are asynchronous, so a
transfer overlaps the loading of the next batch (and, on the slower link, the training step).
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..._keywords import parameter_names, refuse_unknown
from ..state import GradientState, PartialState
from ..tree import (
    find_batch_size,
    flatten_tree,
    ignorant_find_batch_size,
    send_to_device,
    unflatten_tree,
)
from ..tree import slice_tensors as _slice_tensors
from .global_batch import (
    JoinedBatchSampler,
    append_rows,
    cut_leaf,
    detached,
    head_rows,
    joined,
    split_bounds,
)
from .link_gloo import GlooReceiver, GlooSender
from .link_local import LocalReceiver, LocalSender, connect_local, local_link_available
from .loader_pieces import pieces_supported, prepared_steps
from .loader_resume import open_iteration
from .loader_shard import DataLoaderStateMixin, _set_epoch_on
from .stateful import StatefulChoice, loader_parameters
from .wire import Prepared, Preparer, layout, layout_leaves

__all__ = ["DataLoaderDispatcher"]

_END = object()
#: One step: this process's slice (None: it has none), rows in the global batch, rows next.
Step = tuple[Any, int, int]


class DataLoaderDispatcher(StatefulChoice, DataLoaderStateMixin, DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` iterated on process 0 only; each process receives its slice of each batch.

    The default for iterable datasets, and for data that only one process can read. Process 0
    loads ``num_processes`` batches per step (one with ``split_batches``) and every process
    gets an equal slice. With ``even_batches`` the last global batch is completed with samples
    from the first one when it does not divide evenly; with ``even_batches=False`` it is split
    as evenly as possible and a process left without samples gets no last batch.

    Args:
        dataset: the dataset.
        split_batches: slice each batch of the wrapped loader instead of joining
            ``num_processes`` of them.
        skip_batches: steps to skip at the start of every iteration.
        slice_fn: ``fn(batch, slice, process_index=..., num_processes=...)`` cutting a
            process's slice (default: index every tensor).
        even_batches: complete the last batch so every process gets one of the same size.
        use_stateful_dataloader: build the loader on torchdata's ``StatefulDataLoader``, with
            ``state_dict()`` and ``load_state_dict()`` (process 0's state is the one that
            counts: it alone reads the data).
        torch_device_mesh: Accelerate's device mesh: one without a ``"tp"`` dimension
            changes nothing (as in Accelerate); one with tensor parallelism is refused.
        iteration: the epoch the first iteration is (``set_epoch`` is called with it, and it
            counts up with every completed iteration), as in Accelerate.
        kwargs: every other ``DataLoader`` argument (``StatefulDataLoader``'s with
            ``use_stateful_dataloader``); any other name raises ``TypeError``.
    """

    _own_arguments = (
        "split_batches",
        "_drop_last",
        "_non_blocking",
        "slice_fn",
        "even_batches",
        "use_stateful_dataloader",
        "torch_device_mesh",
    )

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., Any] | None = None,
        even_batches: bool = True,
        use_stateful_dataloader: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        refuse_unknown(
            "DataLoaderDispatcher",
            kwargs,
            [*parameter_names(DataLoaderDispatcher), *loader_parameters(self)],
        )
        if "tp" in (getattr(torch_device_mesh, "mesh_dim_names", None) or ()):
            raise NotImplementedError(
                "DataLoaderDispatcher(torch_device_mesh=...) with a 'tp' dimension: tensor "
                "parallelism is not supported by nb_accel; leave the mesh out (every process "
                "is a data parallel rank)"
            )
        super().__init__(dataset, **kwargs)
        self.torch_device_mesh = torch_device_mesh
        self.split_batches = split_batches
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.slice_fn = slice_fn if slice_fn is not None else _slice_tensors
        self.even_batches = even_batches
        self.state = PartialState()
        self.gradient_state = GradientState()
        self.iteration = int(iteration)
        self._joined: JoinedBatchSampler | None = None
        self._link_end: Any = None
        self._check_batch_size()
        self.reset()

    def _check_batch_size(self) -> None:
        size = self._batch_size()
        if size is None and self.even_batches and not self._items_are_batches():
            raise ValueError(
                "this loader's batches vary in size (no batch_size): dispatch it with "
                "even_batches=False"
            )
        parts = self.state.num_processes
        if not self.split_batches and parts > 1 and not hasattr(DataLoader, "_index_sampler"):
            raise RuntimeError(  # torch's iterator would read whole batches, not joined steps
                f"torch {torch.__version__} has no DataLoader._index_sampler, through which a "
                "dispatched loader hands torch's iterator several batches as one step: set "
                "split_batches=True or dispatch_batches=False in the Accelerator's "
                "DataLoaderConfiguration"
            )
        if self.split_batches and size is not None and size > 1 and size % parts:
            raise ValueError(
                f"split_batches needs a batch size ({size}) that is a round multiple of the number "
                f"of processes ({parts})"
            )

    def _batch_size(self) -> int | None:
        if self.batch_size is not None:
            return int(self.batch_size)
        sampler = self.batch_sampler if self.batch_sampler is not None else self.sampler
        size = getattr(sampler, "batch_size", None)
        return None if size is None else int(size)

    def _items_are_batches(self) -> bool:
        """Whether every item the wrapped loader yields is a whole batch (``batch_size=None``)."""
        batched = self.batch_sampler is not None or isinstance(self.sampler, BatchSampler)
        return self.batch_size is None and not batched

    @property
    def _index_sampler(self) -> Any:
        base = super()._index_sampler
        parts = self.state.num_processes if hasattr(self, "state") else 1
        batched = self.batch_sampler is not None or isinstance(self.sampler, BatchSampler)
        if getattr(self, "split_batches", True) or parts == 1 or not batched:
            return base
        joined = getattr(self, "_joined", None)
        if joined is None or joined.base is not base:
            joined = self._joined = JoinedBatchSampler(base, parts, self._drop_last)
        return joined

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes."""
        size = self._batch_size()
        if size is None:
            raise TypeError("this loader's batches vary in size: it has no total batch size")
        return size if self.split_batches else size * self.state.num_processes

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset."""
        return len(self.dataset)  # type: ignore[arg-type]

    def _sample_count(self) -> int:
        if not isinstance(self.dataset, IterableDataset):
            sampler = getattr(self.batch_sampler, "sampler", None) or self.sampler
            try:
                return len(sampler)  # type: ignore[arg-type]
            except TypeError:
                pass
        return self.total_dataset_length

    def __len__(self) -> int:
        steps = super().__len__()  # map-style: counts joined batches already
        parts = self.state.num_processes
        joins = isinstance(self.dataset, IterableDataset) or self._items_are_batches()
        if joins and not self.split_batches and parts > 1:
            steps = steps // parts if self._drop_last else -(-steps // parts)
        steps = max(0, steps - self.skip_batches)
        if self.even_batches or self._drop_last or steps == 0:
            return steps
        try:
            rows = self._sample_count() % self.total_batch_size or self.total_batch_size
        except TypeError:
            return steps
        start, stop = split_bounds(rows, parts, False)[self.state.process_index]
        return steps - 1 if start == stop else steps

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` from now on; passed on to the sampler (or dataset) when it takes one."""
        self.iteration = epoch
        _set_epoch_on(self, epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        replay = open_iteration(self)
        self.begin()
        self.set_epoch(self.iteration)
        if self.state.num_processes == 1:
            steps = self._local_steps()
        else:
            steps = self._serve() if self.state.process_index == 0 else self._receive()
        completed = False
        try:
            for piece, rows, next_rows in steps:
                if replay is not None:
                    replay.finish()  # the epoch's start is replayed: shuffled as it was
                self._handed_out(next_rows <= 0)
                if piece is None:
                    continue
                self._update_state(rows, next_rows)
                self._batches_seen += 1
                yield send_to_device(piece, self.state.device, non_blocking=self._non_blocking)
            completed = True
        finally:
            self.finish_iteration(replay, completed)

    def _has_rows(self, rows: int) -> bool:
        if rows <= 0:
            return False
        parts, me = self.state.num_processes, self.state.process_index
        start, stop = split_bounds(rows, parts, self.even_batches)[me]
        return stop > start

    def _update_state(self, rows: int, next_rows: int) -> None:
        self.end_of_dataloader = not self._has_rows(next_rows)
        if next_rows == 0 and rows > 0:
            self.remainder = rows
        parts, me = self.state.num_processes, self.state.process_index
        holders, following = self._holders(rows), self._holders(next_rows)
        self.set_holders(holders, following, self._batches_seen == 0, parts, me)

    def _holders(self, rows: int) -> tuple[int, ...] | None:
        """The processes holding a slice of a ``rows``-row global batch, ``None`` if all hold
        one of the same size (or there is no such batch)."""
        parts = self.state.num_processes
        if self.even_batches or parts == 1 or rows <= 0 or rows % parts == 0:
            return None
        bounds = split_bounds(rows, parts, False)
        return tuple(r for r, (lo, hi) in enumerate(bounds) if hi > lo)

    def _global_batches(self) -> Iterator[Any]:
        batches: Iterator[Any] = super().__iter__()
        parts = self.state.num_processes
        if self._items_are_batches() and not self.split_batches and parts > 1:
            batches = joined(batches, parts, self._drop_last)  # whole batches in turn
        return itertools.islice(batches, self.skip_batches, None)

    def _local_steps(self) -> Iterator[Step]:
        source = self._global_batches()
        current = next(source, _END)
        while current is not _END:
            upcoming = next(source, _END)
            rows = ignorant_find_batch_size(current) or -1
            yield current, rows, (0 if upcoming is _END else 1)
            current = upcoming

    def _link(self) -> Any:
        """This process's end of the link to the others, connected at the first iteration."""
        if self._link_end is None:
            state = self.state
            if local_link_available(state):
                peers = connect_local(state)
                self._link_end = (
                    LocalSender(peers)
                    if isinstance(peers, dict)
                    else LocalReceiver(peers, state.process_index, state.num_processes)
                )
            elif state.process_index == 0:
                self._link_end = GlooSender(state.num_processes)
            else:
                self._link_end = GlooReceiver(state.process_index)
            weakref.finalize(self, self._link_end.close)
        return self._link_end

    def _serve(self) -> Iterator[Step]:
        """Process 0: load, cut and send every step, one step ahead of what it hands out.

        A link that ``sends_ahead`` (its transfers take long) gets step ``k + 1`` while step
        ``k`` is handed out; otherwise step ``k`` goes out when it is handed out, which keeps
        one batch fewer in memory.
        """
        sender, preparer = self._link(), Preparer()
        source = self._prepared_steps(preparer)
        ahead = 2 if sender.sends_ahead else 1
        queue: deque[Prepared] = deque()

        def top_up() -> None:
            while len(queue) < ahead and (step := next(source, None)) is not None:
                queue.append(step)

        def send(step: Prepared | None, upcoming: int) -> None:
            sender.send(step, queue[upcoming] if len(queue) > upcoming else None)

        sender.begin_epoch()
        try:
            top_up()
            send(None, 0)
            if sender.sends_ahead and queue:
                send(queue[0], 1)
            while queue:
                current = queue.popleft()
                top_up()
                if sender.sends_ahead:
                    if queue:
                        send(queue[0], 1)
                else:
                    send(current, 0)
                yield current.own, current.rows, (queue[0].rows if queue else 0)
        finally:
            sender.drain()

    def _prepared_steps(self, preparer: Preparer) -> Iterator[Prepared]:
        """Process 0: every step of this iteration, loaded, cut and laid out."""
        parts = self.state.num_processes
        size = self._batch_size()
        full = (size if self.split_batches else size * parts) if size is not None else 0
        if (
            full
            and full % parts == 0
            and self.slice_fn is _slice_tensors
            and not self.use_stateful_dataloader  # torchdata counts batches as it loads them
            and pieces_supported(self)
        ):
            head = partial(head_rows, count=parts) if self.even_batches else None
            bounds = split_bounds(full, parts, False)
            cut = self._cut_global
            yield from prepared_steps(self, preparer, bounds, self.skip_batches, head, cut)
            return
        first: Any = None
        for batch in self._global_batches():
            if first is None and self.even_batches:
                first = head_rows(batch, parts)
            yield self._cut_global(preparer, batch, first)

    def _cut_global(self, preparer: Preparer, batch: Any, first: Any) -> Prepared:
        """Cut a global ``batch`` into every process's piece and lay the pieces out."""
        rows = find_batch_size(batch)
        parts = self.state.num_processes
        if self.even_batches and rows % parts:
            missing = parts * -(-rows // parts) - rows
            batch = append_rows(batch, first, missing)
        bounds = split_bounds(rows, parts, self.even_batches)
        if self.slice_fn is _slice_tensors:  # slice the flat leaves directly: far cheaper
            leaves, treedef = flatten_tree(batch)
            cut = [
                None if stop <= start else [cut_leaf(leaf, start, stop) for leaf in leaves]
                for start, stop in bounds
            ]
            # Process 0's piece is copied out so its global batch can be freed at once: keeping
            # views alive holds an extra global batch, which glibc trims and faults back in.
            own = None if cut[0] is None else unflatten_tree(treedef, [detached(c) for c in cut[0]])
            laid = [layout_leaves(treedef, c) if c is not None else None for c in cut]
            return preparer.prepare(rows, own, laid)
        pieces = [
            None
            if stop <= start
            else self.slice_fn(batch, slice(start, stop), process_index=r, num_processes=parts)
            for r, (start, stop) in enumerate(bounds)
        ]
        laid = [layout(piece) if piece is not None else None for piece in pieces]
        return preparer.prepare(rows, pieces[0], laid)

    def _receive(self) -> Iterator[Step]:
        """Every process but 0: take the steps process 0 sends, until the last one."""
        receiver = self._link()
        receiver.begin_epoch()
        try:
            _, _, next_rows = receiver.take()
            while next_rows > 0:
                piece, rows, next_rows = receiver.take()
                yield piece, rows, next_rows
        finally:
            receiver.drain()
