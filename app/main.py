"""The FastAPI app factory. Heavy things (database, encoder, reader, index) load in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import typing
from collections.abc import AsyncIterator
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api import protection
from app.api.request_ids import RequestIds, current_request_id
from app.api.routes import admin, answers, articles, evaluations, feeds, health, schedule
from app.bootstrap import build_context, job_locks
from app.bootstrap.builders import build_answer_service, build_encoder, build_reader_state, open_database
from app.bootstrap.job_configs import scheduler_config
from app.web import dashboard as web_dashboard
from app.web import dashboard_auth as web_dashboard_auth
from app.web import dashboard_evaluations as web_dashboard_evaluations
from app.web import pages as web_pages
from app.web.templating import error_page, static_files, wants_page
from indexer.dates import InvalidDateError
from indexer.index_errors import IndexIntegrityError
from serving.admission import AdmissionGate
from serving.errors import ServiceError
from settings import Settings, get_settings

log = logging.getLogger("app")
FASTAPI_BODY_ERROR = "There was an error parsing the body"  # fastapi.routing's 400 for an unreadable body
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


async def _poll_snapshots(app: FastAPI, every_s: float) -> None:
    """Swap in snapshots that another process (the CLI, the worker) committed."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await run_in_threadpool(app.state.answers.index_state.refresh)
        except IndexIntegrityError as exc:
            log.error("newest index snapshot refused, still serving the previous one: %s", exc)
        except Exception:  # keep serving; the next poll retries
            log.exception("snapshot refresh failed")


async def _poll_reader(app: FastAPI, every_s: float) -> None:
    """Serve the reader version that another process (the CLI, a training job) activated."""
    while True:
        await asyncio.sleep(every_s)
        try:
            # A failed load is logged inside and the previous reader keeps serving.
            await run_in_threadpool(app.state.answers.reader_state.refresh)
        except Exception:  # the database could not be read; the next poll retries
            log.exception("reader refresh failed")


def body_fields(request: Request) -> list[str]:
    """The fields of the JSON body model the request's endpoint takes (for "unknown field" errors)."""
    endpoint = request.scope.get("endpoint")
    try:
        hints = typing.get_type_hints(endpoint) if endpoint is not None else {}
    except Exception:  # an annotation that does not resolve: no list, the error still says what is wrong
        return []
    for hint in hints.values():
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return list(hint.model_fields)
    return []


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = await run_in_threadpool(open_database, settings)
        encoder = await run_in_threadpool(build_encoder, settings)
        reader_state = await run_in_threadpool(build_reader_state, settings, db)
        service = build_answer_service(settings, db, encoder, reader_state)
        try:
            await run_in_threadpool(service.index_state.refresh)
        except IndexIntegrityError as exc:
            log.error("refusing to serve: %s", exc)
            db.close()
            raise
        jobs = build_context(settings, db, encoder=encoder, answer_service=service)
        n = await run_in_threadpool(jobs.runner.recover, job_locks(settings, jobs.runner))
        if n:
            log.warning("marked %d job(s) left running by a stopped process as interrupted", n)
        app.state.db, app.state.answers, app.state.jobs = db, service, jobs
        metrics = getattr(app.state, "answer_metrics", None)
        if service.batcher is not None and metrics is not None:
            service.batcher.on_batch = metrics.observe_batch
        app.state.answer_gate = AdmissionGate(
            max_active=settings.answer_concurrency, max_waiting=settings.answer_queue, max_wait_s=settings.answer_wait_s
        )
        poller = (
            asyncio.create_task(_poll_snapshots(app, settings.snapshot_poll_s)) if settings.snapshot_poll_s else None
        )
        reader_poller = (
            asyncio.create_task(_poll_reader(app, settings.snapshot_poll_s))
            if settings.snapshot_poll_s and reader_state.follows_registry
            else None
        )
        try:
            yield
        finally:
            for task in (poller, reader_poller):
                if task is not None:
                    task.cancel()
            # A job the server started may still be writing (its last step, or the snapshot swap
            # after it): let it end before its database goes.
            running = await run_in_threadpool(jobs.runner.wait_all, settings.shutdown_wait_s)
            if running:
                log.warning(
                    "shutting down while %d background job(s) still run: %s; they are marked "
                    "interrupted at the next start",
                    len(running),
                    ", ".join(running),
                )
            db.close()

    # /docs and /redoc with their scripts served by this process (fastapi-offline), not from a CDN
    app = FastAPIOffline(
        title="Streaming QA",
        version="0.1.0",
        lifespan=lifespan,
        description="Answers dated questions from the news published on or before their date.",
    )
    app.state.settings = settings
    app.state.scheduler = scheduler_config(settings)
    app.include_router(health.router)
    app.include_router(answers.router)
    app.include_router(admin.router)
    app.include_router(articles.router)
    app.include_router(feeds.router)
    app.include_router(evaluations.router)
    app.include_router(schedule.router)
    # The pages: ask (/), the dashboard (/dashboard), their stylesheet and script (/static).
    app.include_router(web_pages.router)
    app.include_router(web_dashboard_auth.router)
    app.include_router(web_dashboard.router)
    app.include_router(web_dashboard_evaluations.router)
    app.mount("/static", static_files(), name="static")

    @app.middleware("http")
    async def _page_headers(request: Request, call_next):
        """The pages may not be framed (no clickjacking of a confirmation) and run only this
        server's scripts; inline style attributes place the time axis' dots."""
        response = await call_next(request)
        if wants_page(request):
            response.headers.setdefault("X-Frame-Options", "DENY")
            response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
            response.headers.setdefault("Referrer-Policy", "same-origin")
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    @app.exception_handler(web_dashboard_auth.LoginRequired)
    async def _login_required(_: Request, exc: web_dashboard_auth.LoginRequired) -> RedirectResponse:
        return RedirectResponse(f"/dashboard/login?{urlencode({'next': exc.next_url})}", status_code=303)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if wants_page(request):
            return error_page(request, exc.status_code, str(exc.detail), getattr(exc, "headers", None))
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and detail == FASTAPI_BODY_ERROR:  # say what a caller should fix
            detail = "the request body could not be read: send UTF-8 JSON with Content-Type: application/json"
        return JSONResponse(
            {"detail": detail, "request_id": current_request_id()},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    protection.install(
        app,
        max_body_bytes=settings.max_body_bytes,
        rate_limit=settings.rate_limit,
        storage_uri=settings.limits_storage,
        admin_failure_limit=settings.admin_failure_limit,
        body_paths={"/admin/articles": (settings.max_articles_body_bytes, "SQA_MAX_ARTICLES_BODY_BYTES")},
    )
    app.add_middleware(RequestIds)  # outermost: every response, a 413 or 429 too, carries X-Request-ID

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        headers = getattr(exc, "headers", None)  # OverloadedError: Retry-After
        if wants_page(request):
            return error_page(request, exc.status_code, str(exc), headers)
        return JSONResponse(
            {"detail": str(exc), "request_id": current_request_id()}, status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(InvalidDateError)
    async def _date_error(_: Request, exc: InvalidDateError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "request_id": current_request_id()}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            if err.get("type") == "json_invalid":  # loc holds the character offset
                reason = err.get("ctx", {}).get("error", "")
                parts.append(f"the body is not valid JSON (at character {where or 0}): {reason}".rstrip(": "))
            elif err.get("type") == "extra_forbidden":
                allowed = body_fields(request)
                parts.append(f"unknown field {where!r}" + (f" (allowed: {', '.join(allowed)})" if allowed else ""))
            else:
                parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        return JSONResponse(
            {"detail": "; ".join(parts) or "invalid request", "errors": errors, "request_id": current_request_id()},
            status_code=422,
        )

    return app
