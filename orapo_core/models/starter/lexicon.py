"""Radiology words the starter's tokenizer must know beyond what PhantomCXR writes.

The tokenizer is trained mostly on PhantomCXR reports, so without this list a
clinician's correction ("retrocardiac opacity", "hilar lymphadenopathy") would
fall apart into single bytes and cost the model many steps per word. These are
written by the project (no corpus is downloaded); each term appears once, so it
earns merges without outweighing the report text the model actually writes.
"""

from __future__ import annotations

RADIOLOGY_TERMS: tuple[str, ...] = (
    # anatomy
    "trachea carina mainstem bronchus bronchi bronchial hilum hilar hila mediastinum mediastinal aortic arch "
    "aortopulmonary window knob descending aorta pulmonary artery superior vena cava azygos cavoatrial junction "
    "right atrium ventricle pericardium pericardial heart cardiac cardiomediastinal silhouette retrocardiac "
    "costophrenic cardiophrenic angle hemidiaphragm diaphragm subdiaphragmatic subpulmonic apex apical apices "
    "lobe lobar segment segmental lingula lingular fissure minor major interlobar pleura pleural parenchyma "
    "parenchymal interstitium interstitial alveolar airspace perihilar peribronchial vascular vasculature "
    "clavicle scapula humerus sternum sternal vertebral vertebra thoracic spine rib ribs posterior anterior "
    "lateral medial upper middle lower base bases basilar bibasilar bilateral unilateral chest wall soft tissue "
    "axilla axillary breast shadow stomach bowel gastric bubble abdomen upper quadrant",
    # findings
    "opacity opacities opacification consolidation consolidative infiltrate infiltrates atelectasis atelectatic "
    "collapse volume loss effusion effusions pneumothorax pneumothoraces hydropneumothorax pneumomediastinum "
    "pneumoperitoneum emphysema emphysematous hyperinflation hyperinflated bullae bulla bleb cyst cavity "
    "cavitary cavitation nodule nodules nodular mass masses granuloma granulomas calcified calcification "
    "calcifications lymphadenopathy adenopathy edema congestion cephalization Kerley lines septal thickening "
    "haziness hazy ground glass reticular reticulonodular fibrosis fibrotic scarring bronchiectasis "
    "cardiomegaly enlarged enlargement widening widened tortuous tortuosity unfolding aneurysm dilated "
    "pneumonia aspiration infection malignancy metastasis metastases neoplasm tumor fracture fractures "
    "displaced nondisplaced healed healing deformity dislocation osteopenia degenerative spondylosis "
    "scoliosis kyphosis lucency lucent density dense sclerotic lytic plaque plaques thickening blunting "
    "meniscus loculated layering subcutaneous air free air elevation elevated",
    # qualifiers and reporting language
    "no evidence of without with and or may represent likely unlikely possible possibly probable cannot be "
    "excluded suspicious concerning compatible consistent suggestive appearance unchanged stable improved "
    "improving worsened worsening increased decreased new interval since prior previous comparison "
    "resolved resolving persistent mild mildly moderate moderately severe severely small large trace tiny "
    "minimal marked minimally slightly subtle focal diffuse patchy linear platelike streaky ill-defined "
    "well-defined rounded normal abnormal within limits clear acute chronic recommend recommended follow-up "
    "CT correlation clinical clinically findings impression history indication technique frontal lateral "
    "portable upright supine semi-erect PA AP view views radiograph radiographs chest x-ray",
    # devices
    "endotracheal tube tracheostomy enteric nasogastric orogastric feeding tip terminates courses catheter "
    "central venous line lines port Port-A-Cath PICC internal jugular subclavian Swan-Ganz pacemaker "
    "defibrillator ICD leads lead generator sternotomy wires sternal clips surgical staples chest tube "
    "drain pigtail valve replacement prosthesis stent hardware fixation plate screws",
    # numbers and units a report uses
    "1 2 3 4 5 6 7 8 9 10 cm mm 1st 2nd 3rd 4th 5th 6th 7th 8th 9th 10th 11th 12th",
)
