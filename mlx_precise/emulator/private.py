"""Whether a folder is safe to run code from: nobody but this user (and root) can
have put anything in it.

Two places load compiled libraries from a folder: the Metal emulator's kernel cache
(:mod:`.compiler`) and MLX's own CPU compiler, which loads
``<temp>/mlx/<version>/cpu/lib<kernel>.so`` if a file of that name exists
(``mlx/backend/cpu/compiled.cpp``) and which the cpu backend drives through
:mod:`mlx_precise.core.jit`. A library another user could write there would run as you.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def unsafe_status(st: os.stat_result, uid: int, *, owner_only: bool,
                  above: bool = False) -> str | None:
    """Why a folder or file with status ``st`` must not be trusted, or None.

    Trusted: owned by this user (``owner_only=False``: or by root) and writable by
    nobody else. A folder ``above`` the one that holds the code may be
    world-writable if it is sticky (``/tmp``): nobody else can then rename or remove
    what is in it (but they could add to it, so the folder itself may not)."""
    owners = (uid,) if owner_only else (uid, 0)
    if st.st_uid not in owners:
        return f"it belongs to uid {st.st_uid}, not to you (uid {uid})"
    if st.st_mode & 0o022 and not (above and stat.S_ISDIR(st.st_mode)
                                   and st.st_mode & stat.S_ISVTX):
        who = "others" if st.st_mode & 0o002 else "its group"
        return f"{who} can write it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def unsafe_folder(path: Path, *, root_may_own: bool = False) -> tuple[Path, str] | None:
    """The first place on the way to the existing folder ``path`` through which
    another user could plant code in it, and why; None when there is none.

    The folder itself must be this user's (``root_may_own``: or root's) and writable
    by nobody else; each folder above it this user's or root's and not writable by
    others unless sticky; a symbolic link on the way is as good as the folder it
    names only if nobody else can repoint it (it is this user's or root's)."""
    uid = os.geteuid()
    given, real = path.absolute(), path.resolve()
    for p in [given, *given.parents]:
        if p.is_symlink() and os.lstat(p).st_uid not in (uid, 0):
            return p, f"it is a link that belongs to uid {os.lstat(p).st_uid}"
    for p in [real, *real.parents]:
        leaf = p == real
        why = unsafe_status(os.stat(p), uid, owner_only=leaf and not root_may_own,
                            above=not leaf)
        if why:
            return p, why
    return None
