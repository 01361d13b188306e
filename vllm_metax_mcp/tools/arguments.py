"""Arguments many tools share: which repository, which subject of it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..core.foundation.errors import bad_input, not_found
from ..core.sources.environment import UpstreamMapping, load_record, resolve_upstream
from ..core.sources.git import Repository, open_repository
from ..core.sources.subjects import (
    RevisionSubject,
    Subject,
    SubjectKind,
    SubjectRequest,
    open_subject,
)
from .spec import ToolEnv


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


class UpstreamArgs(SubjectArgs):
    upstream: str | None = Field(
        default=None, description="Upstream vLLM (git repository or directory); default: the environment record's."
    )
    target: str | None = Field(default=None, description="Upstream revision; default: the environment record's target.")


def open_upstream(
    args: UpstreamArgs, env: ToolEnv, repo: Repository | None, revision: str | None = None
) -> tuple[Subject, UpstreamMapping]:
    """The upstream tree at the target (or at another `revision` of it), from the call's overrides or the record."""
    if args.upstream:
        mapping = resolve_upstream(env.policy, args.upstream, args.target)
    else:
        record = load_record(env.store, repo) if repo else None
        if not record or not record.get("upstream"):
            raise not_found("No upstream: pass upstream (and target), or record one with environment action=establish.")
        mapping = UpstreamMapping(**record["upstream"])
        env.policy.readable(mapping.path)
        env.policy.protect(mapping.path)
    if mapping.kind == "directory":
        if revision:
            raise bad_input("The upstream is a plain directory: it has no revisions to compare (base/target).")
        return open_subject(env.policy, SubjectRequest(SubjectKind.DIRECTORY, path=mapping.path), None), mapping
    upstream_repo = open_repository(mapping.path, env.policy)
    return RevisionSubject(upstream_repo, revision or mapping.target_commit), mapping
