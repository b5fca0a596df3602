"""This machine on the network: names resolved, routes taken, interfaces and their addresses.

Plain socket calls (and ``getifaddrs`` through ``ctypes``): nothing here imports torch, and
nothing sends a packet. A UDP socket that is connected, never written to, tells which local
address the kernel's routing table would use towards a peer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import struct
import sys

__all__ = [
    "split_endpoint",
    "addresses_of",
    "is_loopback",
    "source_toward",
    "interface_addresses",
    "interface_of",
    "network_stack",
    "rendezvous_listener",
]


def split_endpoint(endpoint: str) -> tuple[str, int | None]:
    """``"host:port"`` (also ``"[v6]:port"``) as ``(host, port)``; ``port`` is ``None`` when
    missing or not a number."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or (host.count(":") and not host.startswith("[")):
        host, port = endpoint, ""  # no port, or a bare IPv6 address
    host = host.strip("[]")
    return host, int(port) if port.isdigit() else None


def addresses_of(host: str) -> list[str]:
    """The numeric addresses ``host`` resolves to here, in the resolver's order (an address is
    itself); empty when it does not resolve."""
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    addresses: list[str] = []
    for *_, sockaddr in found:
        address = str(sockaddr[0]).split("%", 1)[0]
        if address not in addresses:
            addresses.append(address)
    return addresses


def is_loopback(address: str) -> bool:
    """True for a loopback address (``127.0.0.0/8``, ``::1``, and IPv4 ones written as IPv6)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback


def source_toward(address: str) -> str | None:
    """The local address this machine sends from towards ``address`` (the routing table's
    choice), or ``None`` without a route."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # UDP: nothing is sent
            return str(probe.getsockname()[0]).split("%", 1)[0]
    except OSError:
        return None


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_IfAddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.c_void_p),
    ("ifa_netmask", ctypes.c_void_p),
    ("ifa_ifu", ctypes.c_void_p),
    ("ifa_data", ctypes.c_void_p),
]


def _sockaddr_address(pointer: int) -> str | None:
    """The IP address in a ``struct sockaddr`` (``None`` for other families)."""
    head = ctypes.string_at(pointer, 2)
    # BSDs and macOS start with a length byte; Linux with a 16-bit family.
    family = (
        head[1]
        if sys.platform == "darwin" or "bsd" in sys.platform
        else struct.unpack("=H", head)[0]
    )
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, ctypes.string_at(pointer + 4, 4))
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, ctypes.string_at(pointer + 8, 16))
    return None


def interface_addresses() -> dict[str, str]:
    """Every IP address of this machine's interfaces, mapped to the interface's name (empty
    where ``getifaddrs`` is not available)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        getifaddrs, freeifaddrs = libc.getifaddrs, libc.freeifaddrs
    except (OSError, AttributeError):
        return {}
    getifaddrs.argtypes = [ctypes.POINTER(ctypes.POINTER(_IfAddrs))]
    freeifaddrs.argtypes = [ctypes.POINTER(_IfAddrs)]
    head = ctypes.POINTER(_IfAddrs)()
    if getifaddrs(ctypes.byref(head)) != 0:
        return {}
    found: dict[str, str] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            if item.ifa_addr and item.ifa_name:
                address = _sockaddr_address(item.ifa_addr)
                if address is not None:
                    found.setdefault(address, item.ifa_name.decode(errors="replace"))
            entry = item.ifa_next
    finally:
        freeifaddrs(head)
    return found


def interface_of(address: str) -> str | None:
    """The name of the interface that holds ``address`` here, or ``None``."""
    found = interface_addresses()
    if address in found:
        return found[address]
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    return next((name for item, name in found.items() if _same(item, wanted)), None)


def _same(text: str, wanted: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        return ipaddress.ip_address(text) == wanted
    except ValueError:
        return False


def network_stack() -> str | None:
    """What names this process's network stack: processes with the same value share their
    loopback (the same kernel boot and network namespace); ``None`` where it cannot be told."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        namespace = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None
    return f"{boot}/{namespace}"


def _listen_address(host: str) -> str | None:
    """The one address of this machine that the rendezvous endpoint ``host`` names: an address
    written as such, else what the name resolves to here; ``None`` when there is none, or more
    than one, or it is a loopback address (then the nodes are told apart by what they say at
    the rendezvous: another machine given this one's real address must still reach it, and a
    name mapped to ``127.0.1.1`` here is another address elsewhere)."""
    try:
        ipaddress.ip_address(host)
        candidates = [host]
    except ValueError:
        candidates = addresses_of(host)
    local = [a for a in candidates if not is_loopback(a) and interface_of(a) is not None]
    return local[0] if len(local) == 1 else None


def rendezvous_listener(endpoint: str) -> socket.socket | None:
    """A socket listening on the endpoint's port on its address only (the interface the other
    nodes reach), for the rendezvous store that this node hosts; ``None`` when the address is
    not this machine's alone or the port cannot be had there (the store then listens on every
    address, as torch's does by itself)."""
    host, port = split_endpoint(endpoint)
    address = _listen_address(host) if port is not None else None
    if address is None or port is None:
        return None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        return None
    return listener
