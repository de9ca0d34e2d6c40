"""Installed versions of the packages that decide results and speed, for manifests and reports."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """Versions of the installed packages among `packages`; missing ones are left out."""
    found = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found
