from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.fabric import infiniband_fabrics, node_fabrics

SUBNET_A = "fec0:0000:0000:0001"
SUBNET_B = "fec0:0000:0000:00b2"


def port(
    root: Path,
    device: str,
    n: int = 1,
    *,
    state: str = "4: ACTIVE",
    phys: str = "5: LinkUp",
    layer: str = "InfiniBand",
    lid: str = "0x1a",
    prefix: str = SUBNET_A,
) -> None:
    p = root / "class" / "infiniband" / device / "ports" / str(n)
    (p / "gids").mkdir(parents=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    (p / "link_layer").write_text(layer + "\n")
    (p / "lid").write_text(lid + "\n")
    (p / "gids" / "0").write_text(f"{prefix}:0002:c903:00f1:1234\n")


def test_active_infiniband_port_names_its_subnet(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0")
    assert infiniband_fabrics(tmp_path) == ["ib-fec0:0000:0000:0001"]


def test_two_hcas_on_one_subnet_are_one_fabric_two_subnets_two(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0")
    port(tmp_path, "mlx5_1")
    port(tmp_path, "mlx5_2", prefix=SUBNET_B)
    assert infiniband_fabrics(tmp_path) == ["ib-fec0:0000:0000:0001", "ib-fec0:0000:0000:00b2"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"state": "1: DOWN"},
        {"state": "2: INIT"},
        {"phys": "3: Disabled"},
        {"phys": "2: Polling"},
        {"layer": "Ethernet"},  # RoCE
        {"lid": "0x0"},
        {"prefix": "fe80:0000:0000:0000"},  # the default prefix names no fabric
    ],
)
def test_ports_that_name_no_fabric(tmp_path: Path, kwargs: dict[str, str]) -> None:
    port(tmp_path, "mlx5_0", 1, **kwargs)
    assert infiniband_fabrics(tmp_path) == []


def test_bad_port_does_not_hide_a_good_one(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", 1, layer="Ethernet")
    port(tmp_path, "mlx5_0", 2)
    (tmp_path / "class" / "infiniband" / "mlx5_1").mkdir()  # no ports dir at all
    assert infiniband_fabrics(tmp_path) == ["ib-fec0:0000:0000:0001"]


def test_unreadable_or_garbled_files_name_no_fabric(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", lid="garbage")
    port(tmp_path, "mlx5_1", prefix="fec0:1")
    assert infiniband_fabrics(tmp_path) == []


def test_no_infiniband_stack_is_no_fabric(tmp_path: Path) -> None:
    assert infiniband_fabrics(tmp_path) == []
    assert node_fabrics([], tmp_path) == []


def test_configured_names_come_first_and_win(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0")
    assert node_fabrics(["ib-b", "ib-a", "ib-b"], tmp_path) == ["ib-b", "ib-a"]
    assert node_fabrics([], tmp_path) == ["ib-fec0:0000:0000:0001"]
