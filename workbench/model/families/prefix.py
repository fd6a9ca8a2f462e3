"""``<family>:<folder>``: a registered family forced on a checkpoint folder."""
from __future__ import annotations


def family_prefix(spec: str) -> tuple[str | None, str]:
    """Split ``<family>:<folder>`` (a registered family forced on a checkpoint folder, e.g. ``idlm:/ckpt/I-DLM-8B``
    whose config says ``sdar``) into ``(family, folder)``; any other value, or a path that exists as written
    (a folder whose name holds a colon), gives ``(None, spec)``.

    Raises :class:`~workbench.model.families.spec.FamilyError` (one line, listing the registered families) for
    ``<name>:<path>`` whose name is not a family (``builtin:`` aside) while the value is not an existing path."""
    import re
    from pathlib import Path

    head, sep, rest = spec.partition(":")
    if not (sep and head and rest) or Path(spec).exists():
        return None, spec
    from .registry import FAMILIES
    from .spec import FamilyError

    if head in FAMILIES:
        return head, rest
    if head != "builtin" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", head):
        raise FamilyError(f"unknown model family {head!r} in {spec!r}; registered: {', '.join(sorted(FAMILIES))} "
                          "(<family>:<folder> forces one; a folder alone is opened by its config.json)")
    return None, spec


__all__ = ["family_prefix"]
