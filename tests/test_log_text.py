"""The ``text`` log format keeps a record's ``extra`` fields on its one line (``runner.TextFormatter``)."""

from __future__ import annotations

import logging

from xmc_resumption.runner import LOG_FORMAT, TextFormatter


def _record(msg: str, extra: dict[str, object] | None = None) -> logging.LogRecord:
    logger = logging.getLogger("xmc.test")
    return logger.makeRecord("xmc.test", logging.INFO, __file__, 1, msg, (), None, extra=extra)


def test_a_text_line_carries_the_calls_extra_fields() -> None:
    record = _record("resumption ended", {"experiment_id": "E1", "outcome": "completed", "replayed": 30})
    line = TextFormatter().format(record)
    assert line.endswith(" INFO xmc.test resumption ended experiment_id=E1 outcome=completed replayed=30"), line


def test_text_with_spaces_or_newlines_stays_one_quoted_line() -> None:
    record = _record("throttled", {"reason": "backlog 500 >= threshold 500\nof group 'audit team'"})
    line = TextFormatter().format(record)
    assert "\n" not in line and line.endswith(" reason=\"backlog 500 >= threshold 500\\nof group 'audit team'\""), line


def test_a_record_without_extras_is_the_plain_format() -> None:
    record = _record("worker polling task queue q")
    assert TextFormatter().format(record) == logging.Formatter(LOG_FORMAT).format(record)
