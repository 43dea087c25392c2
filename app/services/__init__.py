"""Services: the product's use cases, composed from the engine (`orapo_core`) and the database (`db`).

They import no web framework: the CLI and the Gradio tabs both call them, so
an upload in the browser and `orapo ingest` are the same function.
"""
