"""Domain errors raised by services and jobs; app/main.py maps them to HTTP status codes."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class. `status_code` is the HTTP status the API answers with."""

    status_code = 400


class InvalidInputError(ServiceError):
    status_code = 422


class NotFoundError(ServiceError):
    status_code = 404


class ConflictError(ServiceError):
    status_code = 409


class IndexNotReadyError(ServiceError):
    status_code = 503


class NoArticlesError(InvalidInputError):
    """A month (or backfill range) with nothing to ingest."""
