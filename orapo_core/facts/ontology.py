"""The label spaces FactS speaks: the 14 CheXpert observations first, ChestX-ray14 beside them.

Facts are extracted at the finest grain the vocabulary can tell apart (a
"nodule" is a Nodule, not only a Lung Lesion), and each schema is a projection
of those concepts. That keeps one extractor for both schemas and makes the
mapping between them explicit instead of buried in two vocabularies.
"""

from __future__ import annotations

from orapo_core.errors import OrapoError

CHEXPERT_14: tuple[str, ...] = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)

# The five observations of the CheXpert competition, reported by every clinical-efficacy table.
FIVE_OBSERVATIONS: tuple[str, ...] = ("Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion")

# NIH ChestX-ray14 names, spelled as its Data_Entry file and the NegBio gold standard spell them.
CHESTXRAY14: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Effusion",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pneumonia",
    "Pneumothorax",
    "Consolidation",
    "Edema",
    "Emphysema",
    "Fibrosis",
    "Pleural_Thickening",
    "Hernia",
)

# Findings ChestX-ray14 names that CheXpert folds into a broader observation or leaves out.
EXTRA_CONCEPTS: tuple[str, ...] = (
    "Nodule",
    "Mass",
    "Infiltration",
    "Emphysema",
    "Fibrosis",
    "Pleural Thickening",
    "Hernia",
)

# Every concept a fact may carry: CheXpert's observations (less the derived No Finding) and the extras.
CONCEPTS: tuple[str, ...] = CHEXPERT_14[1:] + EXTRA_CONCEPTS

# concept -> the CheXpert observation it is reported under (None: CheXpert has no place for it).
CONCEPT_TO_CHEXPERT: dict[str, str | None] = {c: c for c in CHEXPERT_14[1:]}
CONCEPT_TO_CHEXPERT.update(
    {
        "Nodule": "Lung Lesion",
        "Mass": "Lung Lesion",
        "Infiltration": "Lung Opacity",
        "Fibrosis": "Lung Opacity",
        "Pleural Thickening": "Pleural Other",
        "Emphysema": None,
        "Hernia": None,
    }
)

# concept -> the ChestX-ray14 finding it is reported under. Broad CheXpert observations
# (Lung Opacity, Lung Lesion) have no single ChestX-ray14 counterpart and are left out
# rather than guessed: an "opacity" is not an "infiltrate" to the NIH annotators.
CONCEPT_TO_CHESTXRAY14: dict[str, str | None] = {
    "Enlarged Cardiomediastinum": None,
    "Cardiomegaly": "Cardiomegaly",
    "Lung Opacity": None,
    "Lung Lesion": None,
    "Edema": "Edema",
    "Consolidation": "Consolidation",
    "Pneumonia": "Pneumonia",
    "Atelectasis": "Atelectasis",
    "Pneumothorax": "Pneumothorax",
    "Pleural Effusion": "Effusion",
    "Pleural Other": None,
    "Fracture": None,
    "Support Devices": None,
    "Nodule": "Nodule",
    "Mass": "Mass",
    "Infiltration": "Infiltration",
    "Emphysema": "Emphysema",
    "Fibrosis": "Fibrosis",
    "Pleural Thickening": "Pleural_Thickening",
    "Hernia": "Hernia",
}

# The schema mapping between the two label spaces, ChestX-ray14 -> CheXpert (None: not covered).
CHESTXRAY14_TO_CHEXPERT: dict[str, str | None] = {
    name: CONCEPT_TO_CHEXPERT[concept] for concept, name in CONCEPT_TO_CHESTXRAY14.items() if name is not None
}

SCHEMAS: dict[str, tuple[str, ...]] = {"chexpert": CHEXPERT_14, "chestxray14": CHESTXRAY14}


def schema_labels(schema: str) -> tuple[str, ...]:
    """The observation names of a schema, or an OrapoError naming the schemas there are."""
    try:
        return SCHEMAS[schema]
    except KeyError:
        raise OrapoError(
            "unknown_schema", f"Schema {schema!r} is not known; use one of: {', '.join(SCHEMAS)}."
        ) from None


def project(concept: str, schema: str) -> str | None:
    """The name a concept is reported under in `schema`, or None if the schema has no place for it."""
    if schema == "chexpert":
        return CONCEPT_TO_CHEXPERT.get(concept)
    if schema == "chestxray14":
        return CONCEPT_TO_CHESTXRAY14.get(concept)
    schema_labels(schema)
    return None
