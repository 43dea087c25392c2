"""Initial schema: users, studies, images, drafts, corrections, pairs, rounds, versions, schedule, audit.

The audit log is made append-only in the database itself: triggers refuse
UPDATE and DELETE on SQLite and PostgreSQL alike.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 04:22:30.863784
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa  # noqa: TID253 -- this module is heavy; light ones import it lazily
from alembic import op  # noqa: TID253 -- this module is heavy; light ones import it lazily

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("must_change_password", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_login_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("role IN ('radiologist', 'admin')", name=op.f("ck_users_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("actor_name", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object_type", sa.String(length=64), nullable=True),
        sa.Column("object_id", sa.String(length=64), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["actor_id"], ["users.id"], name=op.f("fk_audit_log_actor_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_action"), "audit_log", ["action"], unique=False)
    op.create_index(op.f("ix_audit_log_actor_id"), "audit_log", ["actor_id"], unique=False)
    op.create_index(op.f("ix_audit_log_created_at"), "audit_log", ["created_at"], unique=False)

    op.create_table(
        "schedule_settings",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("cron", sa.String(length=128), nullable=True),
        sa.Column("schedule_enabled", sa.Boolean(), nullable=False),
        sa.Column("corrections_threshold", sa.Integer(), nullable=True),
        sa.Column("threshold_enabled", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.Integer(), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_schedule_settings_single_row")),
        sa.ForeignKeyConstraint(["updated_by"], ["users.id"], name=op.f("fk_schedule_settings_updated_by_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_settings")),
    )
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_uid_hash", sa.String(length=128), nullable=False),
        sa.Column("patient_pseudonym", sa.String(length=128), nullable=False),
        sa.Column("view_position", sa.String(length=16), nullable=True),
        sa.Column("modality", sa.String(length=16), nullable=True),
        sa.Column("laterality", sa.String(length=8), nullable=True),
        sa.Column("body_part", sa.String(length=64), nullable=True),
        sa.Column("uploaded_by", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("split", sa.String(length=8), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("split IN ('train', 'holdout')", name=op.f("ck_studies_split")),
        sa.CheckConstraint(
            "status IN ('new', 'drafted', 'corrected', 'signed', 'trained')", name=op.f("ck_studies_status")
        ),
        sa.ForeignKeyConstraint(["uploaded_by"], ["users.id"], name=op.f("fk_studies_uploaded_by_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
        sa.UniqueConstraint("study_uid_hash", name=op.f("uq_studies_study_uid_hash")),
    )
    op.create_index(op.f("ix_studies_patient_pseudonym"), "studies", ["patient_pseudonym"], unique=False)
    op.create_index(op.f("ix_studies_status"), "studies", ["status"], unique=False)
    op.create_index(op.f("ix_studies_uploaded_by"), "studies", ["uploaded_by"], unique=False)

    op.create_table(
        "training_rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("log", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("output_dir", sa.String(length=1024), nullable=True),
        sa.Column("started_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'rejected', 'promoted')",
            name=op.f("ck_training_rounds_status"),
        ),
        sa.CheckConstraint("trigger IN ('manual', 'schedule', 'threshold')", name=op.f("ck_training_rounds_trigger")),
        sa.ForeignKeyConstraint(["started_by"], ["users.id"], name=op.f("fk_training_rounds_started_by_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_rounds")),
    )
    op.create_index(op.f("ix_training_rounds_status"), "training_rounds", ["status"], unique=False)

    op.create_table(
        "images",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("dicom_path", sa.String(length=512), nullable=True),
        sa.Column("display_path", sa.String(length=512), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("bits_stored", sa.Integer(), nullable=True),
        sa.Column("source_format", sa.String(length=16), nullable=False),
        sa.Column("warnings", sa.JSON(), nullable=False),
        sa.Column("header", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_images_study_id_studies")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_images")),
    )
    op.create_index(op.f("ix_images_study_id"), "images", ["study_id"], unique=False)

    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("base_model_path", sa.String(length=1024), nullable=False),
        sa.Column("adapter_path", sa.String(length=1024), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("round_id", sa.Integer(), nullable=True),
        sa.Column("study_ids_seen", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('candidate', 'promoted', 'rejected', 'retired')", name=op.f("ck_model_versions_status")
        ),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name=op.f("fk_model_versions_created_by_users")),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["model_versions.id"], name=op.f("fk_model_versions_parent_id_model_versions")
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["training_rounds.id"], name=op.f("fk_model_versions_round_id_training_rounds")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
    )
    op.create_index(op.f("ix_model_versions_round_id"), "model_versions", ["round_id"], unique=False)
    op.create_index(
        "uq_model_versions_one_promoted",
        "model_versions",
        ["status"],
        unique=True,
        sqlite_where=sa.text("status = 'promoted'"),
        postgresql_where=sa.text("status = 'promoted'"),
    )

    op.create_table(
        "drafts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("model_version_id", sa.Integer(), nullable=True),
        sa.Column("model_name", sa.String(length=256), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("sampling", sa.JSON(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("facts", sa.JSON(), nullable=True),
        sa.Column("sentence_scores", sa.JSON(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name=op.f("fk_drafts_created_by_users")),
        sa.ForeignKeyConstraint(
            ["model_version_id"], ["model_versions.id"], name=op.f("fk_drafts_model_version_id_model_versions")
        ),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_drafts_study_id_studies")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drafts")),
    )
    op.create_index(op.f("ix_drafts_study_id"), "drafts", ["study_id"], unique=False)

    op.create_table(
        "corrections",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("draft_id", sa.Integer(), nullable=True),
        sa.Column("author_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=True),
        sa.Column("accepted_unchanged", sa.Boolean(), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("previous_id", sa.Integer(), nullable=True),
        sa.Column("trained_in_round", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["author_id"], ["users.id"], name=op.f("fk_corrections_author_id_users")),
        sa.ForeignKeyConstraint(["draft_id"], ["drafts.id"], name=op.f("fk_corrections_draft_id_drafts")),
        sa.ForeignKeyConstraint(
            ["previous_id"], ["corrections.id"], name=op.f("fk_corrections_previous_id_corrections")
        ),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_corrections_study_id_studies")),
        sa.ForeignKeyConstraint(
            ["trained_in_round"], ["training_rounds.id"], name=op.f("fk_corrections_trained_in_round_training_rounds")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_corrections")),
        sa.UniqueConstraint("study_id", "version", name=op.f("uq_corrections_study_id_version")),
    )
    op.create_index(op.f("ix_corrections_study_id"), "corrections", ["study_id"], unique=False)
    op.create_index(op.f("ix_corrections_trained_in_round"), "corrections", ["trained_in_round"], unique=False)

    op.create_table(
        "preference_pairs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("image_id", sa.Integer(), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("chosen", sa.Text(), nullable=False),
        sa.Column("rejected", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("correction_id", sa.Integer(), nullable=True),
        sa.Column("round_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("source IN ('clinician_edit', 'oracle_step')", name=op.f("ck_preference_pairs_source")),
        sa.ForeignKeyConstraint(
            ["correction_id"], ["corrections.id"], name=op.f("fk_preference_pairs_correction_id_corrections")
        ),
        sa.ForeignKeyConstraint(["image_id"], ["images.id"], name=op.f("fk_preference_pairs_image_id_images")),
        sa.ForeignKeyConstraint(
            ["round_id"], ["training_rounds.id"], name=op.f("fk_preference_pairs_round_id_training_rounds")
        ),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_preference_pairs_study_id_studies")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_preference_pairs")),
    )
    op.create_index(op.f("ix_preference_pairs_correction_id"), "preference_pairs", ["correction_id"], unique=False)
    op.create_index(op.f("ix_preference_pairs_round_id"), "preference_pairs", ["round_id"], unique=False)
    op.create_index(op.f("ix_preference_pairs_study_id"), "preference_pairs", ["study_id"], unique=False)
    _create_audit_guards()


def downgrade() -> None:
    _drop_audit_guards()
    op.drop_index(op.f("ix_preference_pairs_study_id"), table_name="preference_pairs")
    op.drop_index(op.f("ix_preference_pairs_round_id"), table_name="preference_pairs")
    op.drop_index(op.f("ix_preference_pairs_correction_id"), table_name="preference_pairs")

    op.drop_table("preference_pairs")
    op.drop_index(op.f("ix_corrections_trained_in_round"), table_name="corrections")
    op.drop_index(op.f("ix_corrections_study_id"), table_name="corrections")

    op.drop_table("corrections")
    op.drop_index(op.f("ix_drafts_study_id"), table_name="drafts")

    op.drop_table("drafts")
    op.drop_index(
        "uq_model_versions_one_promoted",
        table_name="model_versions",
        sqlite_where=sa.text("status = 'promoted'"),
        postgresql_where=sa.text("status = 'promoted'"),
    )
    op.drop_index(op.f("ix_model_versions_round_id"), table_name="model_versions")

    op.drop_table("model_versions")
    op.drop_index(op.f("ix_images_study_id"), table_name="images")

    op.drop_table("images")
    op.drop_index(op.f("ix_training_rounds_status"), table_name="training_rounds")

    op.drop_table("training_rounds")
    op.drop_index(op.f("ix_studies_uploaded_by"), table_name="studies")
    op.drop_index(op.f("ix_studies_status"), table_name="studies")
    op.drop_index(op.f("ix_studies_patient_pseudonym"), table_name="studies")

    op.drop_table("studies")
    op.drop_table("schedule_settings")
    op.drop_index(op.f("ix_audit_log_created_at"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_actor_id"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_action"), table_name="audit_log")

    op.drop_table("audit_log")
    op.drop_table("users")


_AUDIT_MESSAGE = "audit_log is append-only"


def _create_audit_guards() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION orapo_audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{_AUDIT_MESSAGE}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION orapo_audit_log_append_only()"
        )
    else:
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{event.lower()} BEFORE {event} ON audit_log "
                f"BEGIN SELECT RAISE(ABORT, '{_AUDIT_MESSAGE}'); END"
            )


def _drop_audit_guards() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS orapo_audit_log_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
