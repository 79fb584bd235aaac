"""The files the page hands out to download (an exported conversation, a steering vector): each in a
folder of its own, named by its content, so that the same export is one file however often it is
made; the newest few are kept. (Gradio serves its own copy of each, which it deletes after an hour:
see delete_cache in app.py.)"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def newest_export(root: Path, name: str, keep: int) -> Path:
    """The folder `name` under `root`, made if need be, as the newest export there: of the others,
    all but the `keep` - 1 newest are deleted. It is marked the newest before anything is written
    into it, so that another request's pruning meanwhile does not take it for an old one."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)
    prune_exports(root, folder, keep)
    return folder


def prune_exports(root: Path, newest: Path, keep: int) -> None:
    """Delete all but the `keep` newest exports under `root`; `newest`, just made, stays whatever
    the clock says (file times are coarse: many exports can share one)."""
    def modified(directory: Path) -> int:
        try:
            return directory.stat().st_mtime_ns
        except FileNotFoundError:  # another request pruned it just now
            return 0
    others = sorted((d for d in root.iterdir() if d != newest), key=modified, reverse=True)
    for directory in others[keep - 1:]:
        shutil.rmtree(directory, ignore_errors=True)
