"""A cloud's machine is known by its firmware, and on one `[lan] *` (or a range holding a whole
private block) is refused, while single hosts and narrower ranges stay allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_shared.cloud import AZURE_ASSET_TAG, cloud_from_dmi, detect_cloud
from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.errors import CloudLanRefused
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import find_refusals, judge
from lnk_shared.spec import Origin, SpecBuilder


@pytest.mark.parametrize(
    ("fields", "cloud"),
    [
        ({"sys_vendor": "Amazon EC2", "product_name": "m5.large"}, "aws"),
        ({"sys_vendor": "Xen", "bios_version": "4.11.amazon"}, "aws"),
        ({"bios_vendor": "Amazon EC2"}, "aws"),
        ({"sys_vendor": "Google", "product_name": "Google Compute Engine"}, "gcp"),
        ({"product_name": "Google Compute Engine\n"}, "gcp"),
        ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"}, "azure"),
        ({"chassis_asset_tag": AZURE_ASSET_TAG}, "azure"),
        ({"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, None),
        ({"sys_vendor": "Dell Inc.", "product_name": "PowerEdge R740"}, None),
        ({"sys_vendor": "Microsoft Corporation", "product_name": "Surface Laptop"}, None),
        ({}, None),
    ],
)
def test_cloud_is_read_from_dmi(fields: dict[str, str], cloud: str | None) -> None:
    assert cloud_from_dmi(fields) == cloud


def test_a_machine_without_dmi_is_no_cloud(tmp_path: Path) -> None:
    assert detect_cloud(tmp_path / "missing") is None


def test_dmi_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "sys_vendor").write_text("Google\n")
    assert detect_cloud(tmp_path) == "gcp"


def _refusals(tmp_path: Path, cloud: str | None, *lan: str) -> list[Exception]:
    builder = SpecBuilder()
    for entry in lan:
        builder.add_lan(entry, Origin("test", "--lan-host"))
    spec = builder.build()
    box = BoxPaths(tmp_path / "etc", tmp_path / "state", tmp_path / "run")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    ctx = context_for(1000, env={"PATH": "/usr/bin"}, box=box, home=str(home), cloud=cloud)
    return list(find_refusals(resolve_spec(spec, ctx), ctx))


@pytest.mark.parametrize(
    "lan",
    [
        ["*"],
        ["10.0.0.0/8"],
        ["172.16.0.0/12"],
        ["192.168.0.0/16"],
        ["fc00::/7"],
        ["192.168.1.20", "10.0.0.0/8"],
    ],
)
@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_every_private_network_is_refused_on_a_cloud(
    tmp_path: Path, cloud: str, lan: list[str]
) -> None:
    refusals = _refusals(tmp_path, cloud, *lan)
    assert refusals and isinstance(refusals[0], CloudLanRefused)
    assert cloud in str(refusals[0]) and "lan-on-cloud" in str(refusals[0])
    assert refusals[0].exit_code == 3


@pytest.mark.parametrize(
    "lan", [["192.168.1.20"], ["10.1.2.0/24"], ["nas.home.arpa"], ["172.16.0.0/16"], ["100.64.1.1"]]
)
def test_listed_hosts_and_narrower_ranges_stay_allowed_on_a_cloud(
    tmp_path: Path, lan: list[str]
) -> None:
    assert _refusals(tmp_path, "aws", *lan) == []


@pytest.mark.parametrize("lan", [["*"], ["10.0.0.0/8"]])
def test_every_private_network_is_allowed_off_a_cloud(tmp_path: Path, lan: list[str]) -> None:
    assert _refusals(tmp_path, None, *lan) == []


def test_judge_raises_the_cloud_refusal(tmp_path: Path) -> None:
    builder = SpecBuilder()
    builder.add_lan("*", Origin("test", "--lan-host"))
    box = BoxPaths(tmp_path / "etc", tmp_path / "state", tmp_path / "run")
    (tmp_path / "home").mkdir()
    ctx = context_for(1000, env={}, box=box, home=str(tmp_path / "home"), cloud="gcp")
    with pytest.raises(CloudLanRefused):
        judge(resolve_spec(builder.build(), ctx), ctx)
