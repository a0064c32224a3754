"""Which high-speed fabrics this node is on.

Configured names (`--fabric`, repeatable) win. Otherwise the fabric is derived
from the InfiniBand ports in sysfs:

    <root>/class/infiniband/<device>/ports/<n>/{state,phys_state,link_layer,lid,gids/0}

A port counts when it is ACTIVE, LinkUp, link layer InfiniBand and has a lid
other than 0. Its fabric is named after the subnet prefix, the first 64 bits
of GID 0: `ib-fec0:0000:0000:0001`. Every port of one subnet gives the same
name, so two HCAs on one subnet are one fabric. The default prefix
`fe80:0000:0000:0000` is what every unconfigured subnet uses, so it names no
fabric (two such subnets would wrongly look like one). RoCE ports (link layer
Ethernet) give none either: their GIDs are IP addresses, not subnets.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "fe80:0000:0000:0000"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _port_fabric(port: Path) -> str | None:
    # state reads like "4: ACTIVE", phys_state like "5: LinkUp"
    if not _read(port / "state").upper().endswith("ACTIVE"):
        return None
    if not _read(port / "phys_state").endswith("LinkUp"):
        return None
    if _read(port / "link_layer") != "InfiniBand":
        return None
    lid = _read(port / "lid")
    try:
        if int(lid, 16) == 0:
            return None
    except ValueError:
        return None
    groups = _read(port / "gids" / "0").lower().split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        return None
    prefix = ":".join(groups[:4])
    if prefix == DEFAULT_PREFIX:
        return None
    return f"ib-{prefix}"


def infiniband_fabrics(sysfs_root: Path = Path("/sys")) -> list[str]:
    """Fabric names derived from active InfiniBand ports, sorted, no duplicates."""
    base = sysfs_root / "class" / "infiniband"
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return []  # no InfiniBand stack on this node
    names: set[str] = set()
    for device in devices:
        try:
            ports = sorted((device / "ports").iterdir())
        except OSError:
            continue
        for port in ports:
            name = _port_fabric(port)
            if name:
                names.add(name)
    return sorted(names)


def node_fabrics(configured: Sequence[str], sysfs_root: Path = Path("/sys")) -> list[str]:
    """Configured fabrics if any (in the order given), else derived ones."""
    if configured:
        return list(dict.fromkeys(configured))
    return infiniband_fabrics(sysfs_root)
