"""Data: PhantomCXR synthetic studies and readers for public chest X-ray datasets.

Everything here needs only numpy, Pillow and (for DICOM) pydicom; FactS is
imported lazily, and only when a dataset arrives without labels.
"""

from orapo_core.data.loaders import detect_layout, load_dataset
from orapo_core.data.phantom import DEFAULT_PREVALENCE, FINDING_KINDS, Finding, PhantomStudy, generate_study, write_dataset
from orapo_core.data.records import CHEXPERT_14, StudyRecord

__all__ = [
    "CHEXPERT_14", "DEFAULT_PREVALENCE", "FINDING_KINDS", "Finding", "PhantomStudy", "StudyRecord",
    "detect_layout", "generate_study", "load_dataset", "write_dataset",
]
