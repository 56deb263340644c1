"""Log lines of both services (``pinlog_platform.logging``): JSON objects with the context
fields, or readable text, one record per line."""

from __future__ import annotations

import json
import logging
import re

from pinlog_platform import logging as log_output


def test_json_lines_carry_level_logger_and_the_active_context(restore_root_logging, capfd):
    log_output.configure("json")
    log = logging.getLogger("pinlog.test")

    with log_output.log_context(context_id=42), log_output.log_context(stage="keyword"):
        log.warning("stage left for the rescan: %s", "TimeoutError")
    log.info("outside")

    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    assert [(r["level"], r["logger"], r["message"]) for r in lines] == [
        ("WARNING", "pinlog.test", "stage left for the rescan: TimeoutError"),
        ("INFO", "pinlog.test", "outside"),
    ]
    assert (lines[0]["context_id"], lines[0]["stage"]) == (42, "keyword")
    assert "context_id" not in lines[1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4}", lines[0]["timestamp"])


def test_text_lines_append_the_context_and_keep_a_traceback_below(restore_root_logging, capfd):
    log_output.configure("text")
    log = logging.getLogger("pinlog.test")

    with log_output.log_context(context_id=7):
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")

    first, *rest = capfd.readouterr().err.splitlines()
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4} ERROR ", first)
    assert first.endswith("ERROR pinlog.test: failed context_id=7")
    assert rest[0].startswith("Traceback")
