"""Archive: the hospital's PACS, in and out.

Finding and pulling studies over DICOMweb (`pacs`, `orapo pacs search|pull`),
the Worklist's "From the archive" import as the signed-in reader
(`archive_import`), the DIMSE C-STORE receiver for modalities that push
(`dimse`), and signed reports as DICOM Structured Reports: written to a folder
(`export_sr`, `orapo export sr`) or sent back to the archive on signing
(`sr_send`). Every instance that comes in goes through reading's ingest.
"""
