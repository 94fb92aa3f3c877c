"""Errors the index raises. Messages say what disagrees and what to do about it."""

from __future__ import annotations

REBUILD_HINT = "rebuild the index with `sqa index rebuild`"


class IndexIntegrityError(RuntimeError):
    """Index files on disk disagree with their manifest, the database or the running encoder.

    The server refuses to serve such an index; the message names the shard or file.
    """
