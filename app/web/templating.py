"""The Jinja2 environment of the pages (autoescaping on: a question holding `<script>` is shown,
never run) and the static files they link to."""

from __future__ import annotations

from pathlib import Path

from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from app.api.request_ids import current_request_id

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescapes .html templates


def static_files() -> StaticFiles:
    return StaticFiles(directory=str(HERE / "static"))


def error_page(request, status: int, message: str, headers: dict[str, str] | None = None):
    """An error as a page (the JSON API answers the same errors as JSON), with the error's headers
    (Retry-After)."""
    titles = {
        401: "Log in first",
        403: "Not allowed",
        404: "Not found",
        409: "Busy",
        422: "Check the input",
        429: "Too many requests",
        503: "Not ready",
    }

    back = "/dashboard" if request.url.path.startswith("/dashboard") else "/"
    return templates.TemplateResponse(
        request,
        "error.html",
        {
            "status": status,
            "title": titles.get(status, "Something went wrong"),
            "message": message,
            "back": back,
            "request_id": current_request_id(),
        },
        status_code=status,
        headers=headers,
    )


def wants_page(request) -> bool:
    """A request of the pages (not the JSON API): its errors are answered as pages."""
    path = request.url.path
    return path == "/" or path == "/dashboard" or path.startswith("/dashboard/")
