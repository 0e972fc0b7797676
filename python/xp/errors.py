"""Exceptions raised by the xp package.

Every error that comes from the Rust SDK carries its message unchanged (causes
included). The classes also derive from the matching built-in exception where
one fits, so ``except LookupError`` catches a missing experiment.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "XpError",
    "JoinStringError",
    "ConnectError",
    "RemoteError",
    "NotFoundError",
    "ForbiddenError",
    "BadRequestError",
    "UnavailableError",
    "SpecError",
    "SubmitError",
    "ObjectError",
    "CheckpointError",
    "TrialEnvironmentError",
    "WaitTimeout",
]


class XpError(Exception):
    """Base class of every xp error."""


class JoinStringError(XpError, ValueError):
    """The join string is malformed (expected ``xp://HOST:PORT?token=..&ca=..``)."""


class ConnectError(XpError, ConnectionError):
    """The head could not be reached, refused the credential, or the connection was lost."""


class RemoteError(XpError):
    """The head answered with an error; ``code`` is its wire code (``"Conflict"``, ...)."""

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code


class NotFoundError(RemoteError, LookupError):
    """The named experiment, trial, node or object does not exist."""


class ForbiddenError(RemoteError, PermissionError):
    """The credential may not do this; the message names the role that would."""


class BadRequestError(RemoteError, ValueError):
    """The head refused the request as invalid."""


class UnavailableError(RemoteError):
    """The head cannot serve this now (busy, shutting down, storage full): retry later."""


class SpecError(XpError, ValueError):
    """The experiment spec is invalid; the message names the field (and line)."""


class SubmitError(XpError):
    """The submission could not be prepared (code or data version, program)."""


class ObjectError(XpError):
    """An object could not be stored, found, fetched or copied."""


class CheckpointError(XpError):
    """The node did not store the checkpoint; the message is the node's."""


class TrialEnvironmentError(XpError):
    """The node's environment contract is broken (a variable missing or malformed)."""


class WaitTimeout(XpError, TimeoutError):
    """``Client.wait`` gave up before the experiment finished."""
