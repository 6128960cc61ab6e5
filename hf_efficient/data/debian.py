"""Files of a Debian package without installing it: ``apt-get download`` + ``dpkg -x`` into a folder.

Debian ships several real datasets (Fashion-MNIST in ``dataset-fashion-mnist``, graph-tool's network
collection in ``python3-graph-tool``). ``apt-get install`` would pull in dependencies, start daemons or
upgrade the system Python; unpacking the ``.deb`` takes only its files, with no root needed for ``dpkg -x``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def fetch_debian_package(package: str, destination: str | Path, hint: str = "") -> Path:
    """``apt-get download PACKAGE`` and ``dpkg -x`` it into ``destination/package`` (files only).

    Args:
        package: the Debian package name.
        destination: the folder to unpack into (its ``package`` sub-folder is replaced whole).
        hint: appended to the error message (e.g. where else the files can be found).

    Raises:
        RuntimeError: apt-get / dpkg missing or failing, with the commands to fetch the package by hand.
    """
    destination = Path(destination)
    by_hand = (
        f"Fetch it by hand on any Debian/Ubuntu machine: `apt-get download {package} && dpkg -x "
        f"{package}_*.deb {destination}/package` (or download the .deb from "
        f"https://packages.debian.org/{package} and unpack it with `ar x` + `tar xf data.tar.xz`). {hint}"
    ).strip()
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise RuntimeError(f"apt-get and dpkg are needed to fetch the Debian package {package}. {by_hand}")
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination) as tmp:
        result = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if result.returncode != 0 or not debs:
            raise RuntimeError(
                f"`apt-get download {package}` failed: {result.stderr.strip()[-500:]}. If the package is "
                f"unknown, run `apt-get update` first (as root). {by_hand}"
            )
        unpacked = Path(tmp) / "unpacked"
        subprocess.run(["dpkg", "-x", str(debs[0]), str(unpacked)], check=True, capture_output=True)
        target = destination / "package"
        shutil.rmtree(target, ignore_errors=True)
        os.replace(unpacked, target)  # whole or not at all
    return destination / "package"
