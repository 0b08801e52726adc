"""The dataset report's parent side: what is asked (`tunestudio.config.ReportSpec`, its paths made absolute
by `resolved`), and the bounded child that answers (`run_report` for `tunestudio data inspect`, cli/data.py;
`run_report_async` for `POST /api/datasets/report`). Both faces import this face, never runner.py. The report
itself is computed by `tunestudio.worker.data.report`, in the child."""

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
