"""Services: the product's use cases, composed from the engine (`orapo_core`) and the database (`db`).

They import no web framework: the CLI and the Gradio tabs both call them, so
an upload in the browser and `orapo ingest` are the same function. They are
grouped by what they serve, one package each:

    reading     a reader's day: upload, draft, report, sign, the worklist's order, the viewer
    archive     the PACS: search and pull (DICOMweb), receive (DIMSE), send signed reports back as SRs
    accounts    who is signed in and what they may do: sign-in, sessions, users and roles
    rounds      training rounds: request, run, evaluate, promote, schedule
    insight     what the app shows of its own work: the dashboard's numbers and figures, the rounds' charts
    operations  running the servers: the leader, sweeps, metrics and health, backup and restore, exports

Callers import a module from its group (`from app.services.reading import drafting`); the
groups' `__init__` re-export nothing, except `rounds`, whose callers import its names from it.
"""
