"""Run reports: `write_report(RUN)` draws the plots of a train, eval or select run into RUN/report.html."""

from patchgym.report.html import write_report
from patchgym.report.runs import RunError, run_kind

__all__ = ["RunError", "run_kind", "write_report"]
