"""The dashboard's login (`/dashboard/login`, `/dashboard/logout`): the admin token, checked in
constant time (wrong ones count towards the admin lockout), the session cookie every dashboard page
requires (`SessionCookie`; without it `LoginRequired`, which app/main.py answers with a redirect to
the login page) and the forms' CSRF check.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import SettingsDep
from app.web import session as web_session
from app.web.templating import templates

router = APIRouter(prefix="/dashboard", include_in_schema=False)


class LoginRequired(Exception):
    """No valid session cookie: app/main.py answers with a redirect to the login page."""

    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


def current_session(request: Request, settings: SettingsDep) -> str:
    """The request's valid session cookie, or LoginRequired."""
    value = request.cookies.get(web_session.COOKIE)
    if not web_session.valid_session(settings.admin_token, value):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target if request.method == "GET" else "/dashboard")
    return value


SessionCookie = Annotated[str, Depends(current_session)]


def _safe_next(url: str | None) -> str:
    """Only a path of this site (never //host or a scheme): no open redirect through the login."""
    return url if url and url.startswith("/dashboard") and not url.startswith("//") else "/dashboard"


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


# ---- login ----------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: SettingsDep, next: str = "/dashboard") -> HTMLResponse:
    error = None if settings.admin_token else "admin pages are disabled: set SQA_ADMIN_TOKEN on the server"
    return templates.TemplateResponse(
        request, "login.html", {"next": _safe_next(next), "error": error}, status_code=403 if error else 200
    )


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/dashboard",
) -> Response:
    """The admin token, checked in constant time; wrong ones count towards the admin lockout."""
    target = _safe_next(next)

    def again(message: str, status: int, headers: dict | None = None) -> HTMLResponse:
        return templates.TemplateResponse(
            request, "login.html", {"next": target, "error": message}, status_code=status, headers=headers
        )

    if not settings.admin_token:
        return again("admin pages are disabled: set SQA_ADMIN_TOKEN on the server", 403)
    guard = getattr(request.app.state, "admin_guard", None)
    if guard is not None and (wait := guard.blocked_for(_client(request))) is not None:
        return again(
            f"too many failed logins from this client; try again in {wait:.0f} s",
            429,
            {"Retry-After": str(int(wait) + 1)},
        )
    if not token or not secrets.compare_digest(token.encode(), settings.admin_token.encode()):
        if guard is not None:
            guard.failed(_client(request))
        return again("that is not the admin token (SQA_ADMIN_TOKEN)" if token else "enter the admin token", 401)
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https" or settings.env == "production"
    response.set_cookie(
        web_session.COOKIE,
        web_session.new_session(settings.admin_token),
        max_age=web_session.SESSION_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/dashboard",
    )
    return response


@router.post("/logout")
def logout(
    request: Request, settings: SettingsDep, cookie: SessionCookie, csrf: Annotated[str, Form(max_length=200)] = ""
) -> Response:
    _check_csrf(settings, cookie, csrf)
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(web_session.COOKIE, path="/dashboard")
    return response


def _check_csrf(settings, cookie: str, token: str) -> None:
    if not web_session.valid_csrf(settings.admin_token, cookie, token):
        raise HTTPException(403, "the form's security token is missing or stale: reload the page and try again")
