"""The dataset report's parent side: what is asked (`tunestudio.config.ReportSpec`, its paths made absolute
by `resolved`), the bounded child that answers (`run_report`, `run_report_async`), and `tunestudio data
inspect` (`data_report/cli.py`, imported by the CLI only). The report itself is computed by
`tunestudio.worker.data.report`, in the child."""

from tunestudio.data_report.runner import (
    ReportBusy,
    ReportError,
    ReportTimeout,
    ReportTooLarge,
    resolved,
    run_report,
    run_report_async,
)

__all__ = ["ReportBusy", "ReportError", "ReportTimeout", "ReportTooLarge", "resolved", "run_report",
           "run_report_async"]
