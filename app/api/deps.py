"""Dependencies as named aliases: a route's signature reads as the list of what it needs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Request
from sqlalchemy.orm import Session

from serving.admission import AdmissionGate
from serving.answering import AnswerService
from settings import Settings
from store.engine import Database
from workers.job_context import JobContext


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Database:
    return request.app.state.db


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.db.sessions() as session:
        yield session


def get_jobs(request: Request) -> JobContext:
    """The context background jobs run in (its runner starts them: one at a time per slot)."""
    return request.app.state.jobs


def get_answer_service(request: Request) -> AnswerService:
    return request.app.state.answers


def get_answer_gate(request: Request) -> AdmissionGate:
    """How many answers run at once, and how many may wait (serving/admission.py)."""
    return request.app.state.answer_gate


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
AnswerGateDep = Annotated[AdmissionGate, Depends(get_answer_gate)]
DatabaseDep = Annotated[Database, Depends(get_db)]
SessionDep = Annotated[Session, Depends(get_session)]
AnswerServiceDep = Annotated[AnswerService, Depends(get_answer_service)]
JobsDep = Annotated[JobContext, Depends(get_jobs)]
# A row id in a path: a 64-bit integer the database can compare (a larger one is a 422, not a 500).
RowId = Annotated[int, Path(ge=1, le=2**63 - 1, description="a row id (1 .. 2^63-1)")]


def require_admin(
    request: Request, settings: SettingsDep, x_admin_token: Annotated[str | None, Header()] = None
) -> None:
    if not settings.admin_token:
        raise HTTPException(403, "admin routes are disabled: set SQA_ADMIN_TOKEN on the server")
    guard = getattr(request.app.state, "admin_guard", None)  # app/api/protection.py
    address = request.client.host if request.client else "unknown"
    if guard is not None and (wait := guard.blocked_for(address)) is not None:
        raise HTTPException(
            429,
            f"too many failed admin logins from this client (SQA_ADMIN_FAILURE_LIMIT); try again in {wait:.0f} s",
            headers={"Retry-After": str(int(wait) + 1)},
        )
    if not x_admin_token or not secrets.compare_digest(x_admin_token.encode(), settings.admin_token.encode()):
        if guard is not None:
            guard.failed(address)
        raise HTTPException(
            401, "missing X-Admin-Token header" if not x_admin_token else "wrong admin token (X-Admin-Token)"
        )


AdminDep = Depends(require_admin)
