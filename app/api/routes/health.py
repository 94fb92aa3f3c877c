from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

router = APIRouter(tags=["health"])


class ReadyPublic(BaseModel):
    ready: bool
    reason: str | None = Field(default=None, description="Why not ready (503 only).")
    snapshot: str | None = None
    vectors: int | None = None
    newest_day: str | None = None
    reader: str | None = None
    encoder: str | None = None
    load_s: float | None = Field(
        default=None,
        description="Seconds the serving snapshot took to open and verify "
        "(only its shards that the previous one lacked are read).",
    )


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadyPublic,
    responses={503: {"model": ReadyPublic, "description": "Models still loading, or no index snapshot yet."}},
)
def readyz(request: Request) -> JSONResponse:
    """Ready only when the models and an index snapshot are loaded."""
    state = request.app.state
    answers = getattr(state, "answers", None)
    snapshot = answers.index_state.current() if answers is not None else None
    if answers is None:
        return JSONResponse({"ready": False, "reason": "models are loading"}, status_code=503)
    if snapshot is None:
        return JSONResponse({"ready": False, "reason": "no index snapshot yet: run `sqa ingest`"}, status_code=503)
    return JSONResponse(
        {
            "ready": True,
            "snapshot": snapshot.snapshot_id,
            "vectors": snapshot.index.ntotal,
            "newest_day": snapshot.newest_day.isoformat() if snapshot.newest_day else None,
            "reader": answers.reader.name,
            "encoder": snapshot.manifest.encoder,
            "load_s": round(snapshot.load_s, 4),
        }
    )
