"""Grading: which tests passed, from a test log (SWE-bench's parsers) or from pytest's own structured reports."""

from patchgym.env.grading import family_parsers  # noqa: F401  (registers the r2egym and swesmith parsers)
from patchgym.env.grading.grade import GRADING_ERRORS, Grade, GradeError
from patchgym.env.grading.parsers import PARSERS, parse_log
from patchgym.env.grading.report import ReportMissing, install_report_plugin, read_report
from patchgym.env.grading.report_reader import parse_report

__all__ = ["GRADING_ERRORS", "PARSERS", "Grade", "GradeError", "ReportMissing", "install_report_plugin", "parse_log",
           "parse_report", "read_report"]
