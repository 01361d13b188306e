"""What every tool declares (effect class, models) and what one call of it sees (runtime, environment).

The one dispatch path that runs a declared tool is tools/dispatch.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.foundation.jobs import Jobs
from ..core.foundation.policy import Effect, Mode, Policy
from ..core.foundation.state import (
    OutputRegistry,
    StateStore,
    check_state_dir,
    default_state_dir,
)
from ..core.sources.git import tracked_below
from ..core.sources.interpreters import Interpreters

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
UserAnswer = Literal["accepted", "declined", "not_asked"]


class NextCall(BaseModel):
    """The exact call an agent should make next, and why."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    why: str


class ToolOutput(BaseModel):
    result_id: str = Field(default="", description="Cite this id as tool_result evidence.")
    next_step: NextCall | None = Field(default=None, description="The call to make next (tool, arguments, why).")


class JobInfo(BaseModel):
    id: str
    status: Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled", "lost"]
    progress: dict[str, Any] | None = None
    message: str | None = None


class JobOutput(ToolOutput):
    job: JobInfo | None = Field(
        default=None, description="Set while the work runs; nothing else is: poll `jobs` after poll_after_s."
    )
    poll_after_s: float | None = None
    resource: str | None = Field(default=None, description="The job's status resource URI.")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    effect: Effect
    run: Callable[..., Any]
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    title: str
    idempotent: bool = True
    destructive: bool = False
    cpu_heavy: bool = False
    """Run in a worker process: the event loop stays responsive and a cancelled call kills the work."""
    question: Callable[[BaseModel, ToolEnv], str | None] | None = None
    """A yes/no question for the user before the tool runs (asked through elicitation where the client can)."""

    @property
    def description(self) -> str:
        return inspect.getdoc(self.run) or self.title


@dataclass
class Runtime:
    """One server's (or CLI call's) policy, allowed interpreters, state directory and job table."""

    policy: Policy
    store: StateStore
    interpreters: Interpreters = field(default_factory=Interpreters)
    jobs: Jobs = field(init=False)

    def __post_init__(self) -> None:
        self.jobs = Jobs(self.store)
        # never an output; records the outputs; asks work trees what they track
        self.policy.protect_state(self.store.root, OutputRegistry(self.store), tracked_below)

    @classmethod
    def create(
        cls,
        roots: list[str] | None = None,
        output_roots: list[str] | None = None,
        mode: Mode | str = Mode.EDIT,
        state_dir: str | None = None,
        interpreters: list[str] | None = None,
    ) -> Runtime:
        """The runtime of `serve` / `call`: ToolFailure (a usage error there) for a bad root, a bad
        --python, or a state directory inside a read root (review mode), a repository or a protected path."""
        policy = Policy.create(roots, output_roots, mode)
        location = check_state_dir(Path(state_dir) if state_dir else default_state_dir(), policy)
        allowed = Interpreters.create(interpreters, policy)
        return cls(policy=policy, store=StateStore(location), interpreters=allowed)


@dataclass
class ToolEnv:
    """What one call of a tool sees."""

    runtime: Runtime
    tool: str
    progress: ProgressFn | None = None
    user_answer: UserAnswer = "not_asked"
    """The user's answer to the tool's question; "not_asked" where the client cannot elicit (or the CLI)."""

    @property
    def policy(self) -> Policy:
        return self.runtime.policy

    @property
    def store(self) -> StateStore:
        return self.runtime.store

    @property
    def jobs(self) -> Jobs:
        return self.runtime.jobs

    @property
    def interpreters(self) -> Interpreters:
        return self.runtime.interpreters
