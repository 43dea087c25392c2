"""Every error code the product reports, with one sentence each: what it means and what to do.

An `OrapoError` carries a code and a sentence written where the problem is
known (with the file, the number or the name at hand); this catalogue is the
other half: the one list of codes, grouped by where they come from, that a
script can match on and `docs/pages/reference/errors.md` shows. A test scans the code for every
`OrapoError("...")` and fails on a code missing here, and another keeps
`docs/pages/reference/errors.md` equal to what `python -m orapo_core.error_codes` writes.

Standard library only: the CLI and the docs script import it without torch.
"""

from __future__ import annotations

import sys

# area -> code -> sentence. The areas follow the house: the engine's packages, then the database, the app, the CLI.
CATALOGUE: dict[str, dict[str, str]] = {
    "imaging (upload, DICOM, de-identification)": {
        "empty_file": "The uploaded file has no bytes; choose the image file again.",
        "not_an_image": "The file is not a DICOM, PNG or JPEG image (or is damaged).",
        "content_mismatch": "The file's name says one format and its bytes another; check it is the right file.",
        "unsupported_format": "The file is of a kind that is recognised but not accepted; upload a DICOM, PNG or JPEG image.",
        "not_an_image_object": "The DICOM file is a report, a presentation state or another object with no image.",
        "no_pixel_data": "The DICOM file has no pixel data; upload the radiograph itself, or export it again.",
        "dimension_mismatch": "The DICOM file's stated image size does not match its pixel data; it is damaged.",
        "unsupported_transfer_syntax": "The DICOM file's compression cannot be decoded here; export it uncompressed or as JPEG 2000.",
        "undecodable_pixels": "The image inside the DICOM file could not be decoded.",
        "truncated_file": "The file is cut short or damaged; copy or export it again.",
        "too_many_pixels": "The image is larger than ORAPO_MAX_PIXELS (a decompression bomb, or not a radiograph).",
        "unreadable_image": "The image could not be read although its format is accepted; export it again.",
        "image_invalid": "A drafter was given something that is not a 2-D grey or RGB image.",
        "not_a_chest_radiograph": "The image is not a chest radiograph (another modality or body part, a colour picture, or far unlike any film the model knows); it is stored but never drafted.",
    },
    "facts (labeler, reward, metrics)": {
        "bad_label": "A label value is not 1, 0, -1 or empty.",
        "bad_labels": "Reference labels were not given as a mapping of observation to value.",
        "bad_beta": "FactS's beta must be positive (beta > 1 favours recall).",
        "bad_penalty": "FactS's precision penalty must lie in [0, 1].",
        "no_reference": "A report was scored with neither reference labels nor a reference report.",
        "unknown_schema": "The label schema is not one of chexpert and chestxray14.",
        "reward_shape": "A reward got a different number of completions and reference rows.",
        "unknown_reward": "A reward name is neither in the registry nor an importable 'package.module:function'.",
        "metrics_shape": "Clinical-efficacy metrics got a different number of predictions and references.",
    },
    "data (PhantomCXR, dataset loaders, training data)": {
        "bad_count": "PhantomCXR was asked for a negative number of studies.",
        "bad_size": "PhantomCXR images are 64 to 4096 pixels wide.",
        "bad_format": "PhantomCXR writes png, dicom or both.",
        "bad_png_bits": "PNG images are written with 8 or 16 bits.",
        "bad_prevalence": "A PhantomCXR prevalence is outside [0, 1].",
        "bad_conspicuity": "The PhantomCXR conspicuity setting is not one it knows.",
        "unknown_finding": "A name is not one of PhantomCXR's findings.",
        "dataset_not_found": "The dataset path does not exist.",
        "dataset_layout_unknown": "The folder is not a CheXpert Plus, MIMIC-CXR, IU X-ray or PhantomCXR layout.",
        "unknown_dataset_kind": "The dataset kind is not auto or one of the known layouts.",
        "facts_unavailable": "A dataset without labels needs the FactS labeler, which cannot be imported.",
        "data_missing": "The training data named by the recipe does not exist.",
        "data_invalid": "The training CSV lacks columns a CheXpert Plus CSV needs.",
        "no_image": "A training study has no image; every training study needs one.",
        "no_studies": "There are no studies (with images) to train on or to evaluate.",
    },
    "models (loading, drafting, training runs)": {
        "model_not_found": "The model folder (or the starter) does not exist; run `orapo starter build` for the starter.",
        "model_invalid": "The model folder cannot be served or trained as it is (weights that do not fit its config, no chat template, ...).",
        "adapter_not_found": "The LoRA adapter folder does not exist.",
        "adapter_invalid": "The adapter folder is not a LoRA adapter of this base model.",
        "draft_invalid": "A drafting setting (samples, tokens, temperature, top-p, sample agreement) is out of range.",
        "no_training_steps": "The training data is too small for one optimizer step of the recipe; nothing was trained.",
        "unknown_method": "The ablation was asked for a method it does not know.",
        "ablation_mismatch": "Ablation runs to be merged differ in their plan, or two of them ran the same method.",
    },
    "database (studies, reports, users, rounds, versions)": {
        "invalid_study": "A study id or record is not valid (a study id is a whole number; a study needs its hashed UID and pseudonym).",
        "study_exists": "This study has already been uploaded.",
        "study_not_found": "There is no study with this id.",
        "image_exists": "This image has already been uploaded.",
        "bad_image_path": "A stored image path must be relative to the storage folder.",
        "invalid_status": "A study or round status is not one of the known ones.",
        "correction_exists": "The study already has a report; amend it instead.",
        "correction_not_found": "There is no correction with this id.",
        "already_signed": "The report is already signed; amend it to change it.",
        "draft_not_found": "There is no such draft for this study.",
        "holdout_study": "The study is held out for evaluation; no pairs are made from it and no round trains on it.",
        "invalid_pair": "A preference pair needs a chosen text different from the rejected one.",
        "invalid_pair_source": "A preference pair's source is not one of the known ones.",
        "invalid_username": "A username is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.",
        "invalid_role": "A role is admin or radiologist.",
        "weak_password": "The password is shorter than the minimum length.",
        "password_unchanged": "The new password is the current one.",
        "user_exists": "A user with this name already exists.",
        "user_not_found": "There is no user with this name or id.",
        "user_disabled": "The account is disabled; an administrator can enable it.",
        "bad_credentials": "Unknown username or wrong password.",
        "invalid_trigger": "A round's trigger is not one of manual, schedule and threshold.",
        "invalid_transition": "A round cannot move from its status to the one asked (e.g. a finished round to running).",
        "round_not_found": "There is no training round with this id.",
        "round_not_running": "The round is not running, so it cannot report progress.",
        "version_not_found": "There is no model version with this id.",
        "version_rejected": "The gate rejected this model version; it cannot be served.",
        "promote_conflict": "Another version was promoted at the same moment; reload and try again.",
        "invalid_cron": "The cron line is not a valid 5-field schedule (e.g. '0 2 * * *').",
        "invalid_schedule": "The schedule settings do not go together (e.g. enabled without a cron line).",
    },
    "app services (reading, reports, exports, sign-in)": {
        "not_signed_in": "The request has no signed-in user; sign in first.",
        "forbidden": "The user may not do this (another radiologist's study, or an administrator's action).",
        "password_change_required": "The one-time password must be changed on the Account tab first.",
        "password_mismatch": "The new password and its repetition differ.",
        "cannot_disable_self": "An administrator cannot disable their own account.",
        "not_locked": "Neither an account nor an address of this name is locked out.",
        "image_not_found": "The study, or the file given, has no image.",
        "image_missing": "The stored image file is missing from the storage folder.",
        "unknown_preset": "There is no window preset of this name.",
        "no_draft": "There is no draft to accept; draft the report first.",
        "empty_report": "The report is empty; write or accept a report before saving.",
        "draft_edited": "The text differs from the draft, so it cannot be accepted unchanged; sign it as written.",
        "draft_has_problems": "The draft has a problem the draft checks flag (an empty item or section, a sentence written twice, a finding stated and denied, or a side or severity conflict), so it cannot be accepted unchanged; correct it and sign it as written.",
        "stale_correction": "The report changed since the page opened it (or since the question was asked); nothing was saved.",
        "report_changed": "The report on screen is not the text that was confirmed; nothing was saved.",
        "not_your_session": "The page's session belongs to another user; reload the page.",
        "nothing_to_confirm": "Nothing is waiting to be stored; save or sign the report again.",
        "upload_gone": "An uploaded file was no longer in the upload area when it was to be stored; upload it again.",
        "not_your_upload": "A file named in an upload was not uploaded from this session; nothing was read or stored.",
        "study_not_open": "The page now shows another study than the report being stored; nothing was stored. Check the image and the report, then save or sign again.",
        "no_study": "No study is selected; choose one in the worklist first.",
        "invalid_scope": "The dashboard scope is not one of the known ones.",
        "invalid_bucket": "The dashboard's acceptance grouping is not one of the known ones.",
        "invalid_format": "The export format is not one of the known ones.",
        "no_format": "No export format was chosen.",
        "export_exists": "The export folder exists and is not empty; choose a new one.",
        "nothing_to_export": "There is nothing of this kind to export yet.",
        "no_reports": "The study has no draft or signed report to export.",
        "fhir_invalid": "The FHIR bundle of a study did not validate; nothing was written for it.",
        "no_signed_report": "The study has no signed report; only a signed report becomes a DICOM SR.",
        "no_dicom_image": "The study has no stored DICOM image for its structured report to refer to.",
        "sr_invalid": "The DICOM SR of a report did not read back as it was written; nothing was written for it.",
        "sr_unwritable": "A study's stored DICOM header holds a value DICOM does not allow (stored before ingest checked them), so it cannot become an SR; it is skipped and the others are written.",
    },
    "the archive (PACS over DICOMweb and DIMSE)": {
        "no_archive": "No archive is configured; set ORAPO_DICOMWEB_URL (and its credentials).",
        "invalid_archive_url": "ORAPO_DICOMWEB_URL is not an http(s) URL of a DICOMweb service.",
        "archive_unreachable": "The archive could not be reached; check ORAPO_DICOMWEB_URL and the network.",
        "archive_auth": "The archive refused the credentials; check ORAPO_DICOMWEB_USER/PASSWORD or the token.",
        "archive_error": "The archive answered a request with an error status.",
        "archive_study_not_found": "The archive has no study with this StudyInstanceUID.",
        "archive_refused": "The archive refused to store some of the instances sent (STOW-RS).",
        "archive_link_invalid": "The sealed link to a study's archive study cannot be read: ORAPO_DEID_SECRET changed.",
        "archive_images_not_found": "The archive's study no longer holds the images a signed report was made from.",
        "invalid_sr_send": "Sending signed reports to the archive is off, on_sign or manual.",
        "invalid_reading_order": "The worklist orders unread studies oldest first or most useful to the model first.",
        "sr_send_failed": "A signed report's SR could not be sent to the archive (the send is audited; retry it).",
        "invalid_date": "A date is not YYYY-MM-DD (or YYYYMMDD), or a range is not from an earlier to a later date.",
        "invalid_ae_title": "An AE title is 1 to 16 printable characters without a backslash.",
        "port_in_use": "The DIMSE listener cannot bind its port; choose another --port or stop what uses it.",
    },
    "rounds (policy, data, gate, versions, schedule)": {
        "invalid_setting": "A setting (of a round, or an ORAPO_* variable) does not parse, or has a wrong value; the sentence names it.",
        "managed_setting": "A round sets this recipe value itself (model, data, output); leave it out.",
        "recipe_missing": "The training recipe does not exist.",
        "recipe_invalid": "The training recipe does not parse; the sentence says which value.",
        "nothing_to_train": "There are not enough signed, untrained corrections of training studies for a round.",
        "too_few_corrections": "The corrections (with replay) do not fill one optimizer step of the recipe; nothing was trained.",
        "no_heldout": "There is no held-out set: no signed held-out studies and no PhantomCXR validation split.",
        "round_active": "Another round is queued or running; one round runs at a time.",
        "round_not_queued": "Only a queued round can be run.",
        "round_not_active": "The round is not queued or running, so there is nothing to cancel.",
        "not_resumable": "Only a failed or cancelled round can be resumed.",
        "no_checkpoint": "The round saved no checkpoint to resume from (set save_strategy=steps).",
        "no_rollback_target": "The served model has no earlier version; name one to roll back to.",
        "already_served": "This model version is already the served one.",
        "scheduler_stopped": "The round scheduler is not running in this process.",
        "invalid_threshold": "The new-corrections threshold is a whole number, 1 or more.",
        "invalid_round": "A round id is a whole number; pick a round in the table.",
        "invalid_version": "A version id is a whole number; pick a version in the table.",
        "no_round": "No round is chosen; click it in the table.",
        "no_version": "No model version is chosen; click it in the table.",
        "slurm_unavailable": "ORAPO_ROUND_BACKEND=slurm, but SLURM's client commands are missing here or slurmctld does not answer.",
        "slurm_submit_failed": "SLURM's sbatch refused a round's job; the sentence gives SLURM's reason (partition, account, limits).",
        "ray_unavailable": "ORAPO_ROUND_BACKEND=ray, but ORAPO_RAY_ADDRESS is unset, Ray is not installed, or the cluster does not answer.",
        "ray_submit_failed": "The Ray cluster refused a round's job; the sentence gives Ray's reason.",
        # Recorded as a round's error ("code: sentence"), never raised:
        "worker_failed": "A round's training process failed or saved no model; the round shows the end of its log.",
        "merge_failed": "Folding the served adapter into its base before training failed.",
        "evaluation_failed": "The held-out evaluation process failed; the round shows the end of eval.log.",
        "worker_orphaned": "The app stopped while the round's worker ran; the worker was stopped and the round can be resumed.",
        "worker_gone": "The round's worker process disappeared (the app or the machine restarted).",
        "app_restarted": "The app stopped before the queued round started.",
    },
    "backups (orapo backup and orapo restore)": {
        "backup_exists": "The backup folder exists and is not empty (or lies inside the images or models folder); name a new one.",
        "backup_unsupported": "Backups cover a SQLite database in a file and PostgreSQL; the configured database is neither.",
        "backup_no_database": "There is no database to back up at the configured place; check ORAPO_DATA_DIR or ORAPO_DATABASE_URL.",
        "pg_dump_missing": "PostgreSQL's pg_dump is not on PATH; install the client programs of the server's major version (or newer).",
        "pg_dump_failed": "PostgreSQL's pg_dump could not dump the database; the sentence gives its reason (a version mismatch, a refused login).",
        "backup_invalid": "The folder is not an OraPO backup: its manifest.json is missing, does not parse or names files outside it.",
        "backup_damaged": "A file of the backup is missing or differs from the one the backup was made with; nothing was restored.",
        "backup_database_mismatch": "The backup holds a SQLite database and PostgreSQL is configured, or the other way round.",
        "backup_newer": "The backup was made by a newer OraPO (its schema revision is unknown here); restore it with that release.",
        "restore_not_empty": "The data folder or the database to restore into is not empty; restore into new, empty ones.",
        "restore_secret_mismatch": "ORAPO_DEID_SECRET is set to another secret than the backup's; unset it or set it to the backup's.",
        "pg_restore_missing": "PostgreSQL's pg_restore is not on PATH; install the client programs of the server's major version (or newer).",
        "pg_restore_failed": "PostgreSQL's pg_restore could not restore the dump into the configured database; the sentence gives its reason.",
        "integrity_failed": "The restored data failed the integrity check (rows, SQLite's checks, schema revision, files); the sentence says what.",
    },
    "command line and web server": {
        "bad_option": "A command-line option is out of range.",
        "eval_invalid": "An `orapo eval` option is out of range.",
        "missing_column": "The CSV has no column of the given name.",
        "reports_unreadable": "The reports file cannot be read.",
        "no_password": "The password was to come from stdin (--password-stdin), but stdin had none.",
        "study_or_all": "The FHIR or DICOM SR export needs one study id or --all.",
        "study_or_since": "Pulling from the archive needs its study UIDs or --since DATE.",
        "no_benchmarks": "Benchmarks ship with a source checkout; none are next to this installation.",
        "unknown_benchmark": "There is no benchmark of this name (`orapo bench` lists them).",
        "not_available": "The subcommand is not part of this build.",
        "interrupted": "The command was stopped by the user (Ctrl-C).",
        "internal_error": "An unexpected failure; set ORAPO_DEBUG=1 to see the traceback and report it.",
        "file_too_large": "The uploaded file is larger than ORAPO_MAX_UPLOAD_MB.",
    },
}

ERROR_CODES: dict[str, str] = {code: sentence for codes in CATALOGUE.values() for code, sentence in codes.items()}


def describe(code: str) -> str:
    """The catalogue's sentence for `code` (KeyError for a code that is not catalogued)."""
    return ERROR_CODES[code]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The catalogue as `docs/pages/reference/errors.md` (a page of the docs site)."""
    lines = [
        "# Error codes",
        "",
        "<!-- generated by `python -m orapo_core.error_codes > docs/pages/reference/errors.md`; do not edit by hand -->",
        "",
        "Every refusal is printed (and shown in the app) as `code: sentence`. The sentence at the time names",
        "the file, number or setting at hand; this table says what each code means in general. The codes are",
        f"stable: scripts may match on them. {len(ERROR_CODES)} codes, from `orapo_core/error_codes.py`.",
        "",
    ]
    for area, codes in CATALOGUE.items():
        lines += [f"## {area[0].upper()}{area[1:]}", "", "| code | meaning |", "| --- | --- |"]
        lines += [f"| `{code}` | {_cell(sentence)} |" for code, sentence in codes.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
