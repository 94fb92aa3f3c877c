"""Durable file replacement: write beside the target, fsync, rename over it, fsync the directory.
A crash leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

TMP_SUFFIX = ".tmp"  # temp files: ".<final name>.<8 hex>.tmp" beside the final file


def fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (a no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: Buffer) -> None:
    """Write `data` to a temp file beside `path`, fsync, rename over `path`, fsync the directory."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def replace_folder(dest: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a folder beside `dest`, which then takes dest's place (a crash leaves the
    old folder, or none, never half of the new one)."""
    tmp = dest.with_name(dest.name + TMP_SUFFIX)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
