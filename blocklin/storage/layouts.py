"""The member arrays of blocklin's group outputs, by the operation that wrote them.

Every commit lists the arrays it wrote below an output's root in the provenance
(``attrs["blocklin"]["members"]``, :func:`blocklin.storage.guard.output_members`), and ``overwrite``
replaces those and nothing else. Groups committed before that record existed carry only the
operation that wrote them: their members are the arrays of that operation's layout, which this
module names, so that ``overwrite`` replaces blocklin's own old outputs while an array or folder
someone put inside one (any other name, or a node below a member) still refuses it.

The names are literals here (storage sits below the operations that write them);
``tests/storage/test_old_outputs.py`` checks that every group today's operations write lists members
within its operation's layout.
"""

from __future__ import annotations

from typing import Any

#: The arrays an ``svd`` or ``pca`` group may hold: the factors, the means and scales it was factored
#: with, and an updatable result's kept state (:mod:`blocklin.linalg.lowrank.updatable`).
SVD_MEMBERS = ("U", "S", "Vt", "mean", "scale", "state_comoments", "state_mean", "state_corange", "state_core",
               "state_range_gram", "state_range")
#: The arrays of an ``eigsh`` group: eigenvalues and eigenvectors.
EIGSH_MEMBERS = ("w", "V")
#: The group outputs' layouts by the provenance's ``operation``.
GROUP_LAYOUTS = {"svd": SVD_MEMBERS, "eigsh": EIGSH_MEMBERS}
#: The operations that write a ``blocklin-csr`` sparse group (:mod:`blocklin.storage.sparse`).
SPARSE_OPERATIONS = ("convert", "from_sparse")


def layout_members(meta: Any) -> list[str]:
    """The member node paths of the group output whose root metadata (``zarr.json``, parsed) is
    ``meta``, by the layout of the operation its provenance names; none where the root is not a group,
    the operation writes no group, or a sparse operation's root lacks the ``blocklin-csr`` attributes."""
    from blocklin.storage.sparse import ARRAYS, FORMAT_NAME

    if not isinstance(meta, dict) or meta.get("node_type") != "group":
        return []
    attrs = meta.get("attributes")
    prov = attrs.get("blocklin") if isinstance(attrs, dict) else None
    op = prov.get("operation") if isinstance(prov, dict) else None
    if not isinstance(op, str):
        return []
    if op in SPARSE_OPERATIONS:
        return list(ARRAYS) if attrs.get("format") == FORMAT_NAME else []
    return list(GROUP_LAYOUTS.get(op, ()))


__all__ = ["EIGSH_MEMBERS", "GROUP_LAYOUTS", "SPARSE_OPERATIONS", "SVD_MEMBERS", "layout_members"]
