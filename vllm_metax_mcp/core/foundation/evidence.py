"""Typed evidence items: what a recorded decision rests on, in a form the server can check."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field


class FileEvidence(BaseModel):
    kind: Literal["file"] = "file"
    path: str = Field(description="Repository-relative POSIX path.")
    line: int = Field(ge=1)
    rev: str = Field(description="Blob sha or revision the path and line refer to.")


class CommitEvidence(BaseModel):
    kind: Literal["commit"] = "commit"
    sha: str


class ToolResultEvidence(BaseModel):
    kind: Literal["tool_result"] = "tool_result"
    result_id: str


class TestEvidence(BaseModel):
    kind: Literal["test"] = "test"
    name: str
    outcome: Literal["passed", "failed", "skipped", "error"]


class ProbeEvidence(BaseModel):
    kind: Literal["probe"] = "probe"
    probe_id: str


class NoteEvidence(BaseModel):
    kind: Literal["note"] = "note"
    text: str


Evidence = Annotated[
    FileEvidence | CommitEvidence | ToolResultEvidence | TestEvidence | ProbeEvidence | NoteEvidence,
    Field(discriminator="kind"),
]
