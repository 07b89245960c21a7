"""Views of a conformance run's records: Markdown summary (reports.markdown)."""
