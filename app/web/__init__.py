"""The web pages: ask a dated question (`/`), and the operator's dashboard (`/dashboard`).

Server-rendered Jinja2 templates over the same services the JSON API uses; the few lines of
JavaScript and the stylesheet are this package's own files, served by this process (no CDN, no
build step).
"""
