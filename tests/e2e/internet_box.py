"""A private box whose proxy sees the test internet (`net.py`) as the only one there is: the
proxy's config lines for it, the folder that shows a sandbox the test CA, and a shell run in a
sandbox of that box as its owner, with curl granted and the CA readable.

    with TestInternet() as internet, private_box(proxy_config=proxy_config(internet)) as box:
        with ca_folder(internet) as ca_dir:
            ran = in_sandbox(running_box, box, ca_dir, f"--internet-host={WWW}", script=...)
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from as_owner import run_lnk

RunningBox = Any  # tests/e2e/conftest.py
PrivateBox = Any  # the same
TestInternet = Any  # net.py


def proxy_config(internet: TestInternet, *lines: str) -> str:
    """The proxy's config that makes `internet` the only one: its public subnet counts as public
    and its table answers every lookup; `lines` after those."""
    return "\n".join(
        (
            f'unsafe_public_networks = ["{internet.public_subnet}"]',
            f'unsafe_dns_table = "{internet.dns_file}"',
            *lines,
        )
    )


@contextmanager
def ca_folder(internet: TestInternet) -> Iterator[Path]:
    """A folder under /srv (which a sandbox may be granted) holding the test CA as `ca.pem`,
    readable by everyone; removed on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="lnk-ca-", dir="/srv"))
    try:
        folder.chmod(0o755)
        shutil.copy(internet.ca_file, folder / "ca.pem")
        (folder / "ca.pem").chmod(0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def in_sandbox(
    running_box: RunningBox, box: PrivateBox, ca_dir: Path, *flags: str, script: str
) -> subprocess.CompletedProcess[str]:
    """`script` by /bin/sh in a new sandbox of `box`, launched by the owner from its home: the CA
    folder readable, curl granted, and `flags` as well."""
    words = ["sandbox", "run", "--yes", f"--read={ca_dir}", "--command=curl", *flags]
    return run_lnk(running_box, *words, "--", "/bin/sh", "-c", script, box=box)
