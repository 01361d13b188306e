"""Arguments many tools share: which repository, which subject of it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..core.environment import load_record
from ..core.git import Repository, open_repository
from ..core.subjects import Subject, SubjectKind, SubjectRequest, open_subject
from .base import ToolEnv


class SubjectArgs(BaseModel):
    plugin_repo: str = Field(default=".", description="The vLLM-MetaX repository (relative to the first --root).")
    subject: SubjectKind = Field(
        default=SubjectKind.WORKTREE,
        description="worktree (files on disk), index (the staged snapshot), revision, directory, or installed "
        "(where the recorded interpreter imports vllm_metax from).",
    )
    revision: str | None = Field(default=None, description="Commit, tag or branch for subject=revision.")
    directory: str | None = Field(default=None, description="Plain source directory for subject=directory.")


def open_plugin_repo(args: SubjectArgs, env: ToolEnv) -> Repository | None:
    if args.subject is SubjectKind.DIRECTORY:
        return None
    return open_repository(args.plugin_repo, env.policy)


def open_plugin_subject(
    args: SubjectArgs, env: ToolEnv, repo: Repository | None, record: dict[str, Any] | None = None
) -> Subject:
    """The subject a call names; `installed` comes from the given (or stored) environment record."""
    origin = None
    if args.subject is SubjectKind.INSTALLED:
        if record is None and repo is not None:
            record = load_record(env.store, repo)
        origin = (record or {}).get("runtime_package_dir")
        for site in (record or {}).get("site_dirs", []):
            env.policy.allow_read(site)
    request = SubjectRequest(args.subject, path=args.directory, revision=args.revision, installed_origin=origin)
    return open_subject(env.policy, request, repo)
