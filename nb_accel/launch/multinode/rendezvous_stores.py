"""The stores of a node's c10d rendezvous, each listening on one address: the rendezvous
store (hosted by node 0) on its endpoint's, and the store the workers share (hosted by the node
the rendezvous makes its rank 0) on that node's; torch's listen on every address of the
machine."""

from __future__ import annotations

import time
import weakref
from typing import Any

from .network import rendezvous_listener, split_endpoint
from .rendezvous_pace import wait_listening

__all__ = ["CONNECT_TRY_S", "rendezvous_handler", "store_client", "store_server"]

#: The longest one try of a node's store client may take to connect and be answered.
CONNECT_TRY_S = 1.0


def store_server(address: str, port: int, timeout_s: float | None = None) -> Any:
    """A TCP store server listening on ``address`` only (``port`` 0: a free one); ``None``
    when ``address`` is not this machine's alone (or the port is taken)."""
    host = f"[{address}]" if ":" in address else address
    listener = rendezvous_listener(f"{host}:{port}")
    if listener is None:
        return None
    from datetime import timedelta

    import torch.distributed as dist

    options: dict[str, Any] = {}
    if timeout_s is not None:
        options["timeout"] = timedelta(seconds=timeout_s)
    return dist.TCPStore(
        address,
        int(listener.getsockname()[1]),
        is_master=True,
        multi_tenant=True,
        master_listen_fd=listener.detach(),  # the store's own socket from now on
        **options,
    )


def store_client(host: str, port: int, within_s: float) -> Any:
    """A client of the TCP store at ``host:port``, connected within ``within_s`` seconds (its
    calls then wait as long), in tries of :data:`CONNECT_TRY_S` at most: torch's client tries
    again and waits for the store's answer in native code, where the notebook's interrupt is
    not heard until it gives up (a node whose peer's store listened, then stopped, waited out
    the whole rendezvous timeout after its user pressed stop).

    Raises:
        RendezvousConnectionError: no store answered in time (as torch's own client says).
    """
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    deadline = time.monotonic() + within_s
    while True:
        left = deadline - time.monotonic()
        try:
            store = dist.TCPStore(
                host,
                port,
                is_master=False,
                timeout=timedelta(seconds=max(0.1, min(CONNECT_TRY_S, left))),
            )
        except (RuntimeError, TimeoutError) as problem:  # (a bad address raises at once)
            if deadline - time.monotonic() > 0:
                continue
            raise RendezvousConnectionError(
                "The connection to the C10d store has failed."
            ) from problem
        store.set_timeout(timedelta(seconds=within_s))
        return store


def _handler_on(store: Any, parameters: Any) -> Any:
    """torch's c10d rendezvous handler on ``store`` (made here, not by torch's registry)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    return create_handler(store, C10dRendezvousBackend(store, parameters.run_id), parameters)


def rendezvous_handler(parameters: Any, hosts_store: bool) -> Any:
    """torch's c10d rendezvous handler, whose stores listen on one address only: the
    rendezvous store (hosted here) on the endpoint's, and the store the workers share (hosted
    by the node that becomes the rendezvous' rank 0) on that node's. Where that cannot be (an
    address that is not the machine's alone, another torch), a store listens on every address,
    as torch's does by itself."""
    from torch.distributed.elastic.rendezvous import registry

    handler: Any = None
    if hosts_store and parameters.backend == "c10d":
        host, port = split_endpoint(parameters.endpoint)
        read_timeout = float(parameters.get_as_int("read_timeout", 60))
        store = store_server(host, port, read_timeout) if port is not None else None
        if store is not None:
            handler = _handler_on(store, parameters)
    if handler is None and not hosts_store and parameters.backend == "c10d":
        host, port = split_endpoint(parameters.endpoint)
        if port is not None:  # node 0 may be starting it now
            read_timeout = float(parameters.get_as_int("read_timeout", 60))
            deadline = time.monotonic() + read_timeout
            wait_listening(host, port, read_timeout)
            store = store_client(host, port, max(1.0, deadline - time.monotonic()))
            handler = _handler_on(store, parameters)
    if handler is None:
        handler = registry.get_rendezvous_handler(parameters)
    create = getattr(type(handler), "_create_tcp_store_server", None)
    if create is not None:  # torch's method for the workers' store: on this node's address
        weak = weakref.ref(handler)  # no cycle: the stores go with the handler

        def on_one_address(master_addr: str, master_port: int) -> Any:
            bound = store_server(master_addr, master_port)
            return bound if bound is not None else create(weak(), master_addr, master_port)

        handler._create_tcp_store_server = on_one_address
    return handler
