from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request

from app.api.deps import AnswerGateDep, AnswerServiceDep
from app.api.operator_metrics import observe_answers
from app.api.request_ids import arrived_at
from app.api.schemas import API_ERRORS, AnswerPublic, AnswerRequest, ErrorPublic, PassagePublic
from indexer.dates import parse_iso_day

router = APIRouter(prefix="/v1", tags=["answers"], responses=API_ERRORS)


@router.post(
    "/answers",
    response_model=AnswerPublic,
    responses={
        503: {
            "model": ErrorPublic,
            "description": "No index yet, or too many questions at once (Retry-After says when to try again)",
        }
    },
)
def post_answer(body: AnswerRequest, service: AnswerServiceDep, gate: AnswerGateDep, request: Request) -> AnswerPublic:
    """Answer a question from the news published on or before `as_of`, citing the passages."""
    as_of = parse_iso_day(body.as_of, what="as_of") if body.as_of is not None else None
    service.validate(body.question, body.top_k)  # a bad request is told so at once, not after its turn
    result = service.cached(body.question, as_of, body.top_k)  # asked before: no turn at the gate
    queued_s = None
    if result is None:
        with gate.admit(since=arrived_at(request)) as queued_s:
            result = service.answer(body.question, as_of, body.top_k)
    observe_answers(request, [result], queued_s)
    # where the time went: "queue" from the request's arrival until the gate let it in, then the
    # stages (or "cache": the lookup of an answer given before, with no turn at the gate)
    timings = {"queue": round((queued_s or 0.0) * 1000, 1), **result.timings_ms}
    passages = [
        PassagePublic(**{k: v for k, v in asdict(p).items() if k in PassagePublic.model_fields})
        for p in result.passages
    ]
    return AnswerPublic(
        answer=result.answer,
        as_of=result.as_of,
        passages=passages,
        versions=result.versions,
        timings_ms=timings,
        notes=result.notes,
        grounded=result.grounded,
        evidence=result.evidence,
        confidence=result.confidence,
        cached="cache" in result.timings_ms,
    )
