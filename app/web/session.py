"""The dashboard's login: the admin token, entered once, becomes a signed session cookie.

The cookie never holds the token. It holds `<issued unix time>.<HMAC-SHA256(token, issued)>`, so:
- it is HttpOnly (page scripts cannot read it) and SameSite=Strict (other sites' forms do not send
  it), and Secure whenever the request came over HTTPS or the server runs with SQA_ENV=production;
- it expires after SESSION_MAX_AGE_S, and changing SQA_ADMIN_TOKEN ends every session at once;
- each state-changing form carries a CSRF token derived from the session (HMAC of the cookie),
  checked on submit (`check_csrf`): a stolen page of another session does not carry over.
"""

from __future__ import annotations

import hashlib
import hmac
import time

COOKIE = "sqa_session"
SESSION_MAX_AGE_S = 12 * 3600


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def new_session(secret: str, now: float | None = None) -> str:
    """A fresh cookie value for a client that has just given the right token."""
    issued = int(time.time() if now is None else now)
    return f"{issued}.{_mac(secret, f'session|{issued}')}"


def valid_session(secret: str, value: str | None, now: float | None = None) -> bool:
    """True for a cookie this server signed with `secret`, not older than SESSION_MAX_AGE_S."""
    if not secret or not value or value.count(".") != 1:
        return False
    issued, mac = value.split(".")
    if not issued.isdigit():
        return False
    age = (time.time() if now is None else now) - int(issued)
    if not -60 <= age <= SESSION_MAX_AGE_S:  # a minute of clock skew between replicas
        return False
    return hmac.compare_digest(mac, _mac(secret, f"session|{issued}"))


def csrf_token(secret: str, session_value: str) -> str:
    """The hidden form field that proves a POST comes from a page this session was served."""
    return _mac(secret, f"csrf|{session_value}")


def valid_csrf(secret: str, session_value: str | None, token: str | None) -> bool:
    if not session_value or not token:
        return False
    return hmac.compare_digest(token, csrf_token(secret, session_value))
