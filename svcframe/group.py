"""Group files: which servers make up a service. The one reader and the one writer of them.

A group file is Mochi Flock's group file, which svcframe reads and writes as it is::

    {"members": [{"address": "tcp://10.0.0.1:41234", "provider_id": 0}, ...],
     "metadata": {...}}

- A member's **rank** is its ``rank`` field when it has one (svcframe writes it), else its index in
  ``members`` (Flock's rule). Two members with one rank are an error.
- ``provider_id`` is the member's admin provider id (``admin.provider_id``; 0, Bedrock's, when absent).
- svcframe also writes ``pid``, ``host`` and ``ready`` (when the member accepted calls, seconds since the
  epoch); every other key, here or in ``metadata``, is ignored, so a Flock file reads as it is.

Writers: ``svcframe launch`` (``svcframe.launch``), rank 0 of ``svcframe serve --group-file``
(``svcframe.ranks``) and the first member of a group provider's view (``svcframe.group_provider``: its members
also carry ``member_id`` and ``group_provider_id``, its metadata ``group``), through :func:`write_group_file` or
:func:`write_group_document` (a temporary file, then a rename: a reader never sees a partial group). Readers: every CLI verb with ``-g/--group``, ``ServiceGroupHandle.from_group_file``,
``selftest.remote``, through :func:`read_group_file`.

Errors: :class:`~svcframe.errors.GroupError`, one line naming the file and the problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config import ADMIN_PROVIDER_ID, ProviderId, format_validation_error
from .errors import GroupError

#: The environment variable naming the group file CLI verbs use when given neither addresses nor -g/--group
#: (``svcframe launch`` sets it for its servers: their group providers keep that file).
GROUP_ENV = "SVCFRAME_GROUP"
#: The environment variable ``svcframe launch`` gives each server its rank in.
RANK_ENV = "SVCFRAME_RANK"
#: The provider types of a group that knows who is alive (``svcframe.group_provider``; ``flock`` is Mochi's name).
GROUP_PROVIDER_TYPES = ("group", "flock")


@dataclass(frozen=True)
class Member:
    """One server of a group.

    Attributes:
        rank: its rank in the group (0-based).
        address: the address its engine listens on.
        provider_id: its admin provider id.
        pid: its process id (None when the file does not say, as in Flock's files).
        host: the host it runs on (None when the file does not say).
        ready: when it accepted calls, seconds since the epoch (None when the file does not say).
    """

    rank: int
    address: str
    provider_id: int = ADMIN_PROVIDER_ID
    pid: int | None = None
    host: str | None = None
    ready: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The member's entry in a group file (fields that are None left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Group:
    """The members of a group file (in rank order), its metadata and where it was read from."""

    members: list[Member]
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def select(self, ranks: Iterable[int] | None) -> list[Member]:
        """The members of the given ranks, in the order given (every member for None).

        Raises:
            GroupError: a rank the group does not have.
        """
        if ranks is None:
            return list(self.members)
        by_rank = {m.rank: m for m in self.members}
        missing = [r for r in ranks if r not in by_rank]
        if missing:
            have = ", ".join(str(m.rank) for m in self.members)
            raise GroupError(f"group file {self.path}: no rank {', '.join(map(str, missing))} (ranks: {have})")
        return [by_rank[r] for r in ranks]


class _MemberEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rank: int | None = Field(None, ge=0)
    address: str = Field(min_length=1)
    provider_id: ProviderId = ADMIN_PROVIDER_ID
    pid: int | None = None
    host: str | None = None
    ready: float | None = None


class _GroupDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    members: list[_MemberEntry] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


def read_group_file(path: str | os.PathLike[str]) -> Group:
    """Read a group file (svcframe's or Flock's; see the module docstring).

    Returns:
        the :class:`Group`, members in rank order.

    Raises:
        GroupError: the file cannot be read, is not JSON, is not a group file, has no members or two
            members of one rank; one line that names the file and the problem.
    """
    where = f"group file {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise GroupError(f"{where}: cannot read: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        raise GroupError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict) or "members" not in data:
        raise GroupError(
            f'{where}: not a group file (expected {{"members": [{{"address": ..., "provider_id": ...}}, ...]}})'
        )
    try:
        doc = _GroupDocument.model_validate(data)
    except ValidationError as exc:
        problems = format_validation_error(exc, where).splitlines()
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise GroupError(problems[0] + more) from None
    members: dict[int, Member] = {}
    for index, entry in enumerate(doc.members):
        rank = index if entry.rank is None else entry.rank
        if rank in members:
            raise GroupError(f"{where}: two members have rank {rank}")
        members[rank] = Member(rank, entry.address, entry.provider_id, entry.pid, entry.host, entry.ready)
    return Group([members[r] for r in sorted(members)], doc.metadata, Path(path))


def write_group_file(path: str | os.PathLike[str], members: Sequence[Member], metadata: Mapping[str, Any]) -> None:
    """Write a group file atomically (a temporary file beside it, then a rename), members in rank order.

    Raises:
        OSError: the directory cannot be written.
    """
    doc = {"members": [m.to_dict() for m in sorted(members, key=lambda m: m.rank)], "metadata": dict(metadata)}
    write_group_document(path, doc)


def write_group_document(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Write a whole group document (``{"members": [{...}, ...], "metadata": {...}}``, members as JSON objects
    with any keys: a group provider's view adds its own) atomically: a temporary file beside it, then a rename.

    Raises:
        OSError: the directory cannot be written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def read_group_document(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A group file as it is (every key of its members and metadata kept, for a writer that changes part of it);
    None when it is missing, unreadable, not JSON or not a group file (``{"members": [...]}``)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("members"), list):
        return None
    if not isinstance(doc.get("metadata"), dict):
        doc["metadata"] = {}
    doc["members"] = [m for m in doc["members"] if isinstance(m, dict)]
    return doc
