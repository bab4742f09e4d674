"""Worktree confinement: file operations that cannot leave one directory.

A leaf package (standard library and `apiary.errors` only) shared by the agent SDK and the
coordinator's engine. `ConfinedRoot` holds a directory fd and resolves every relative path
beneath it with openat2(2) (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS) or,
where the kernel lacks it, a component-by-component O_NOFOLLOW walk; it refuses "..",
absolute paths, symlinks, device nodes, FIFOs and sockets with permission_denied.
See docs/confinement.md.
"""

from __future__ import annotations

from apiary.confined.openat2 import available as openat2_available
from apiary.confined.paths import DenialReason
from apiary.confined.resolver import ResolverName
from apiary.confined.root import ConfinedRoot, DeniedHook

__all__ = ["ConfinedRoot", "DenialReason", "DeniedHook", "ResolverName", "openat2_available"]
