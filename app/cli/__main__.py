"""`python -m app.cli ...` runs `sqa ...`."""

from app.cli import main

main()
