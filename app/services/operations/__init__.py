"""Operations: what hospital IT runs and watches, rather than what a reader does.

Which of several servers runs what must run once (`leader`), the sweep of
uploads a crash left behind (`cache_sweep`), Prometheus metrics and the health
checks (`metrics`), backups and restoring them (`backup`, `restore`), and the
exports: preference pairs and prompts as datasets, reports as FHIR (`export`,
`orapo export`), and the short-lived zips an administrator downloads from the
app (`export_downloads`).
"""
