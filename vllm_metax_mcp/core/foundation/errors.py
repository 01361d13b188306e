"""The one error type every layer raises, with the stable codes of the design."""

from __future__ import annotations

from enum import Enum
from typing import Any


class ErrorCode(str, Enum):
    OUTSIDE_ROOTS = "outside_roots"
    PROTECTED_PATH = "protected_path"
    INVALID_REVISION = "invalid_revision"
    TARGET_UNCONFIRMED = "target_unconfirmed"
    REVIEW_MODE = "review_mode"
    BLOCKED = "blocked"
    BAD_INPUT = "bad_input"
    NOT_FOUND = "not_found"
    BUSY = "busy"
    FAILED = "failed"


class ToolFailure(Exception):
    """A refusal or failure a caller can act on: a stable code plus a message saying what to do."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        """Survive pickling across worker processes (the default would lose code and details)."""
        return (_rebuild, (self.code, self.message, self.details))

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


def _rebuild(code: ErrorCode, message: str, details: dict[str, Any]) -> ToolFailure:
    return ToolFailure(code, message, **details)


def bad_input(message: str, **details: Any) -> ToolFailure:
    return ToolFailure(ErrorCode.BAD_INPUT, message, **details)


def not_found(message: str, **details: Any) -> ToolFailure:
    return ToolFailure(ErrorCode.NOT_FOUND, message, **details)
