"""The input listings a run takes (:func:`blocklin.storage.stamps.stamp_inputs`), counted by tests of their cost."""

from __future__ import annotations


def count_listings(monkeypatch) -> list[str]:
    """The URL of every input each later listing covers, in order (a list the caller reads and clears)."""
    from blocklin.storage import stamps

    real, listed = stamps.stamp_inputs, []

    def counting(inputs):
        inputs = list(inputs)
        listed.extend(i.url for i in inputs)
        return real(inputs)

    monkeypatch.setattr(stamps, "stamp_inputs", counting)
    return listed
