"""Typed evidence items: what a recorded decision rests on, in a form the server can check."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Item(BaseModel):
    """A key an item does not have is a mistake (`revison`), not something to drop in silence."""

    model_config = ConfigDict(extra="forbid")


class FileEvidence(_Item):
    kind: Literal["file"] = "file"
    path: str = Field(description="Repository-relative POSIX path.")
    line: int = Field(ge=1)
    rev: str = Field(description="Blob sha or revision the path and line refer to.")


class CommitEvidence(_Item):
    kind: Literal["commit"] = "commit"
    sha: str


class ToolResultEvidence(_Item):
    kind: Literal["tool_result"] = "tool_result"
    result_id: str


class TestEvidence(_Item):
    kind: Literal["test"] = "test"
    name: str
    outcome: Literal["passed", "failed", "skipped", "error"]


class ProbeEvidence(_Item):
    kind: Literal["probe"] = "probe"
    probe_id: str


class NoteEvidence(_Item):
    kind: Literal["note"] = "note"
    text: str


Evidence = Annotated[
    FileEvidence | CommitEvidence | ToolResultEvidence | TestEvidence | ProbeEvidence | NoteEvidence,
    Field(discriminator="kind"),
]
