"""Job progress over weighted stages that repeat: a multi-month ingest reaches 100% with its last month."""

from __future__ import annotations

import pytest

from app.bootstrap import open_context
from workers.progress import JobProgress


def test_repeated_weighted_stages_share_the_whole_by_rounds(sqlite_settings):
    with open_context(sqlite_settings) as ctx:
        job_id = ctx.runner.create("ingest", {})
        progress = JobProgress(ctx.sessions, job_id, every_s=0, weights={"chunk": 0.1, "encode": 0.9})
        progress.rounds(3)  # three months
        for month in range(3):
            progress.stage("chunk", 1)
            progress.advance()
            progress.stage("encode", 10)
            progress.advance(5)
            assert progress.fraction == pytest.approx((month + 0.1 + 0.45) / 3)
            progress.advance(5)
            # a month done is a third of the job: never 100% before the last month
            assert progress.fraction == pytest.approx((month + 1) / 3)
        assert ctx.runner.get(job_id).progress == pytest.approx(progress.fraction, abs=1e-4)
        assert ctx.runner.get(job_id).message == "encode: 10/10"
