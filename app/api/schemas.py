"""HTTP request and response bodies (`<Thing>Request` / `<Thing>Public`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class AnswerRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"question": "Which team does Damar Hamlin play for?", "as_of": "2023-01-05", "top_k": 5}]
        },
    )

    question: str = Field(description="The question, in plain English.")
    as_of: str | None = Field(
        default=None, description="YYYY-MM-DD: answer from news published on or before this day (default: today, UTC)."
    )
    # strict: "5" and true are refused, not read as 5 and 1
    top_k: StrictInt | None = Field(
        default=None, description="How many passages to retrieve (default SQA_TOP_K), a JSON integer."
    )


class PassagePublic(BaseModel):
    passage_id: int
    title: str
    url: str
    published: dt.date
    score: float
    text: str


class AnswerPublic(BaseModel):
    answer: str
    as_of: dt.date
    passages: list[PassagePublic]
    versions: dict[str, str]
    timings_ms: dict[str, float]
    notes: list[str] = []
    grounded: bool = Field(
        default=False,
        description="Whether a passage the reader read states the answer "
        "(headline or text, SQuAD-normalised). False: the answer is "
        "the reader's inference or a guess; check the passages.",
    )
    evidence: list[int] = Field(
        default=[], description="The passage_ids of the passages read that state the answer, best rank first."
    )
    confidence: float | None = Field(
        default=None,
        description="The reader's probability of the answer it wrote "
        "(0..1; null for readers that give none). On the "
        "RealTimeQA slice, answers at 0.7 or more were right "
        "57-69% of the time, under 0.15 3-5%.",
    )
    cached: bool = Field(
        default=False,
        description="Whether this answer was given before to the same question, as_of and top_k, over "
        "the same index snapshot and models, and is served again without reading (SQA_ANSWER_CACHE); "
        "timings_ms then holds the lookup ('cache').",
    )


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    month: str = Field(description="YYYY-MM: the month of articles to (re-)ingest.")


class ReencodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    encoder: str = Field(
        min_length=1,
        max_length=200,
        description="The encoder to switch the index to: a trained version (GET /admin/encoders) or 'minilm'.",
    )


class EncoderVersionPublic(BaseModel):
    version: str
    towers: str | None = None
    trained_until: str | None = None
    validation: dict[str, Any] = {}
    serving: bool = False


class JobPublic(BaseModel):
    id: int
    kind: str
    state: str
    params: dict[str, Any]
    progress: float
    message: str
    counts: dict[str, Any]
    timings: dict[str, Any]
    error: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class JobStarted(BaseModel):
    job_id: int
    state: str
    status_url: str


class SnapshotPublic(BaseModel):
    snapshot_id: str
    vectors: int
    shards: list[str]
    encoder: str
    newest_day: dt.date | None


class ReaderVersionPublic(BaseModel):
    version: str
    kind: str
    parent_version: str | None
    trained_until: dt.date | None
    month: str | None
    state: str
    active: bool
    metrics: dict[str, Any]
    job_id: int | None
    created_at: dt.datetime


class ServingReaderPublic(BaseModel):
    reader: str | None = Field(description="The name of the reader answering in this process.")
    version: str | None = Field(description="Its registry version (null: a built-in reader or a folder).")
    follows_active: bool = Field(description="True when SQA_READER=auto: this process serves the active version.")
    loaded_at: dt.datetime | None
    error: str | None = Field(description="The last version that failed to load here, and why.")


class ReaderModelsPublic(BaseModel):
    versions: list[ReaderVersionPublic]
    serving: ServingReaderPublic


class ReaderActivatedPublic(BaseModel):
    version: str
    active: bool
    serving: ServingReaderPublic
    notes: list[str] = []


class FinetuneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    month: str = Field(description="YYYY-MM: fine-tune the active reader on this month's news.")


class MonthDriftPublic(BaseModel):
    month: str = Field(description="YYYY-MM: the month whose news is compared.")
    reference: str = Field(description="previous | earlier | training: what it is compared with.")
    reference_first: str = Field(description="YYYY-MM: the first month of the reference.")
    reference_last: str = Field(description="YYYY-MM: the last month of the reference.")
    reader_version: str | None = Field(
        description="The trained reader whose training months are the reference (training rows only)."
    )
    encoder: str
    n_target: int = Field(description="Passages of the month.")
    n_source: int = Field(description="Passages of the reference months.")
    measures: dict[str, float] = Field(
        description="unseen_words, unseen_words_tokens, [unseen_entities, unseen_entities_tokens,] cosine, kl."
    )
    computed_at: dt.datetime


# ---- errors ------------------------------------------------------------------------------------------


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description="Where the problem is: body, query or path, then the field.")
    msg: str
    type: str


class ErrorPublic(BaseModel):
    """Every error the JSON API answers with (app/main.py's handlers, the body and rate limits)."""

    detail: str = Field(description="What is wrong, in a sentence a caller can act on.")
    request_id: str | None = Field(
        default=None, description="This request's id (also the X-Request-ID header); the server's log lines carry it."
    )
    errors: list[ErrorItem] | None = Field(default=None, description="422 on a malformed request: one item a problem.")


ERROR_DESCRIPTIONS = {
    400: "The request cannot be carried out as asked, or its body could not be read (not UTF-8 JSON).",
    401: "Missing or wrong X-Admin-Token.",
    403: "Admin routes are disabled (no SQA_ADMIN_TOKEN on the server).",
    404: "No such row (job, evaluation run, reader version) or nothing loaded yet.",
    409: "A conflicting job is running, or the server's settings forbid it; try again when it ends.",
    413: "The request body is over SQA_MAX_BODY_BYTES.",
    422: "The request is malformed: `detail` says what is wrong, `errors` lists each problem.",
    429: "Too many requests from this client (SQA_RATE_LIMIT), or too many failed admin logins "
    "(SQA_ADMIN_FAILURE_LIMIT); Retry-After says when to try again.",
    503: "Not ready (no index yet) or too busy (Retry-After says when to try again).",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error codes, each with the ErrorPublic body."""
    return {code: {"model": ErrorPublic, "description": ERROR_DESCRIPTIONS[code]} for code in codes}


def json_error_responses(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """The same error responses for a route whose success is not JSON (an HTML report): FastAPI
    would document its errors with the route's media type; they are JSON like everywhere else."""
    ref = {"$ref": "#/components/schemas/ErrorPublic"}
    return {
        code: {"description": r["description"], "content": {"application/json": {"schema": ref}}}
        for code, r in responses.items()
    }


# Every JSON API route: a body that cannot be read or is too large, a malformed request, too many requests.
API_ERRORS = error_responses(400, 413, 422, 429)
# Every admin route besides: authentication, lookups, conflicts, a store not ready.
ADMIN_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 422, 429, 503)


# ---- live news (app/api/routes/articles.py) --------------------------------------------------------


class ArticleRejectedPublic(BaseModel):
    line: int = Field(description="The NDJSON line, or the position in the JSON array, from 1.")
    field: str = Field(description="The field at fault ('record' for the record as a whole).")
    reason: str
    url: str | None = None


class ArticleResultPublic(BaseModel):
    line: int
    url: str
    outcome: str = Field(description="new | updated (a new version: the old passages are retired) | duplicate")
    article_id: int


class ArticlesStoredPublic(BaseModel):
    new: int
    updated: int
    duplicate: int
    rejected: int
    errors: list[ArticleRejectedPublic]
    results: list[ArticleResultPublic]
    waiting: int = Field(description="Articles stored but not yet searchable (the live queue, all clients).")
    published: dict | None = Field(None, description="With ?publish=true: the live publish this request ran.")


class LivePieceMonthPublic(BaseModel):
    month: str
    pieces: int
    passages: int


class BrokerRejectionPublic(BaseModel):
    message: str = Field(description="The message, by its stream sequence.")
    line: int | None = Field(description="The record's line (NDJSON) or position (array), from 1.")
    field: str
    reason: str
    url: str | None


class BrokerStatusPublic(BaseModel):
    """The worker's NATS JetStream consumer (SQA_NATS_URL), as it last wrote its status."""

    url: str
    subject: str
    connected: bool
    messages: int = Field(description="Messages acknowledged or terminated since the worker started.")
    new: int
    updated: int
    duplicate: int
    rejected: int = Field(description="Records rejected (their messages' good records were stored).")
    terminated: int = Field(description="Messages with nothing to store: not delivered again.")
    redelivered: int = Field(description="Messages delivered more than once (a crash or a failed commit).")
    last_message_at: dt.datetime | None
    last_error: str | None
    last_error_at: dt.datetime | None
    recent_rejections: list[BrokerRejectionPublic]


class LiveStatusPublic(BaseModel):
    waiting: int = Field(description="Articles stored but not yet searchable.")
    oldest_waiting_at: dt.datetime | None
    last_publish_at: dt.datetime | None = Field(description="When the serving snapshot was committed.")
    newest_article_at: dt.datetime | None = Field(
        description="When the newest searchable article arrived (stored, or last changed)."
    )
    newest_day: dt.date | None = Field(description="The newest publication day in the serving index.")
    months: list[LivePieceMonthPublic] = Field(description="Live pieces of the serving snapshot, by month.")
    broker: BrokerStatusPublic | None = Field(None, description="The NATS consumer, where SQA_NATS_URL is set.")


# ---- feeds (app/api/routes/feeds.py) ---------------------------------------------------------------


class FeedRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"url": "https://news.example/rss.xml", "source": "example"}]}
    )

    url: str = Field(max_length=2048, description="The RSS or Atom feed's http(s) URL.")
    source: str = Field("", max_length=64, description="The articles' source name (default: the feed's host).")


class FeedPublic(BaseModel):
    url: str
    title: str = Field(description="The feed's own title, once fetched.")
    source: str
    active: bool
    last_fetch_at: dt.datetime | None
    last_ok_at: dt.datetime | None
    last_status: int | None = Field(
        description="The HTTP status of the last fetch (None: no answer, or never fetched)."
    )
    last_error: str | None = Field(description="Why the last poll failed, or which entries it skipped.")
    failures: int = Field(description="Polls failed in a row; each doubles the wait before the next.")
    last_new: int = Field(description="New or updated articles at the last fetch with content.")
    articles_total: int = Field(description="Articles this feed brought in.")
    next_fetch_at: dt.datetime | None = Field(description="When the worker polls it next (None: at once).")
