"""Is this machine a cloud's (AWS, Google Cloud, Azure)? Read from its firmware (DMI), which a
program on the machine cannot change, and never from the network (no metadata request).

On such a machine the private ranges are the cloud's network, not the owner's, so a spec's
`[lan] hosts = ["*"]` or a range holding a whole private block is refused (`refusals`).
What this does NOT do: recognise every cloud (others are treated as ordinary machines) or a
machine whose firmware was made to look like another's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["DMI_DIR", "DMI_FIELDS", "cloud_from_dmi", "detect_cloud", "read_dmi"]

DMI_DIR = Path("/sys/class/dmi/id")
DMI_FIELDS = (
    "sys_vendor",
    "product_name",
    "bios_vendor",
    "bios_version",
    "chassis_asset_tag",
    "board_vendor",
)
MAX_FIELD = 256  # DMI strings are short; more is not a DMI string
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"  # every Azure VM's chassis asset tag


def cloud_from_dmi(fields: Mapping[str, str]) -> str | None:
    """ "aws", "gcp", "azure" or None, from DMI strings (pure)."""
    f = {k: v.strip().lower() for k, v in fields.items()}
    vendor, product = f.get("sys_vendor", ""), f.get("product_name", "")
    bios_vendor, bios_version = f.get("bios_vendor", ""), f.get("bios_version", "")
    if "amazon" in vendor or "amazon ec2" in bios_vendor or "amazon" in bios_version:
        return "aws"
    if vendor == "google" or product == "google compute engine" or bios_vendor == "google":
        return "gcp"
    if f.get("chassis_asset_tag", "") == AZURE_ASSET_TAG or (
        vendor == "microsoft corporation" and product == "virtual machine"
    ):
        return "azure"
    return None


def read_dmi(directory: Path = DMI_DIR) -> dict[str, str]:
    fields = {}
    for name in DMI_FIELDS:
        try:
            with open(directory / name, "rb") as f:
                fields[name] = f.read(MAX_FIELD).decode("utf-8", "replace")
        except OSError:
            continue  # a field the firmware lacks, or a machine without DMI
    return fields


def detect_cloud(directory: Path = DMI_DIR) -> str | None:
    return cloud_from_dmi(read_dmi(directory))
