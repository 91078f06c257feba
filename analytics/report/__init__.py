"""Fleet reports for a time range: facts from the store's views, plots, HTML/Markdown/JSON
(:mod:`~analytics.report.report`); ``clockmesh report`` (:mod:`~analytics.report.cli`)."""
