"""The words FactS knows, written by this project as regular-expression fragments.

Kept apart from the rules so a site can read, review and extend the vocabulary
without touching the logic. Patterns are matched against lower-cased text on
word boundaries; misspellings seen in real reports sit beside the right spelling.
Order inside a concept does not matter: the matcher prefers the longest mention.
"""

from __future__ import annotations

# Section headers (lower case, without the colon) -> canonical section.
SECTION_HEADERS: dict[str, str] = {
    "findings": "findings",
    "finding": "findings",
    "report": "findings",
    "description": "findings",
    "impression": "impression",
    "impressions": "impression",
    "conclusion": "impression",
    "conclusions": "impression",
    "summary": "impression",
    "opinion": "impression",
    "interpretation": "impression",
    "indication": "indication",
    "indications": "indication",
    "history": "indication",
    "clinical history": "indication",
    "clinical information": "indication",
    "clinical indication": "indication",
    "reason for exam": "indication",
    "reason for examination": "indication",
    "comparison": "comparison",
    "comparisons": "comparison",
    "prior": "comparison",
    "technique": "technique",
    "procedure": "technique",
    "exam": "technique",
    "examination": "technique",
    "views": "technique",
    "recommendation": "recommendation",
    "recommendations": "recommendation",
}

# Sections whose sentences describe the request, not the image: no facts are drawn from them.
NON_FINDING_SECTIONS = frozenset({"indication", "comparison", "technique"})

# concept -> mention patterns that name the finding itself.
MENTIONS: dict[str, tuple[str, ...]] = {
    "Enlarged Cardiomediastinum": (
        r"enlarged cardiomediastin\w*",
        r"cardiomediastinal (?:enlargement|widening)",
        r"widen(?:ed|ing) (?:of (?:the )?)?(?:superior )?mediastin\w*",
        r"mediastinal (?:widening|enlargement|prominence|mass)",
        r"(?:widened|wide) mediastin\w*",
    ),
    "Cardiomegaly": (
        r"cardiomegal(?:y|ly|ey)",
        r"cardiac (?:enlargement|megaly)",
        r"enlarge(?:d|ment of the) (?:heart|cardiac silhouette|cardiac shadow)",
        r"enlarged cardiac (?:silhouette|shadow|size)",
        r"(?:heart|cardiac) enlargement",
    ),
    "Lung Opacity": (
        r"opaci(?:ty|ties|fication|fications|fied)",
        r"air[\s-]?space (?:disease|process|densit(?:y|ies))",
        r"(?:increased |focal |parenchymal |patchy )densit(?:y|ies)",
        r"interstitial (?:markings?|opacit\w+|pattern|prominence|thickening|changes?|disease|lung disease)",
        r"reticular (?:markings?|opacit\w+|pattern|changes?)",
        r"reticulonodular (?:opacit\w+|pattern|markings?|changes?)",
        r"haz(?:y|iness)",
        r"scar(?:ring|s)?",
        r"cicatri\w+",
        r"ground[\s-]glass",
    ),
    "Lung Lesion": (
        r"lesions?",
        r"nodular (?:opacit\w+|densit\w+|lesions?)",
        r"cavitar\w+",
        r"cavit(?:y|ies)",
        r"tumou?rs?",
        r"neoplasm\w*",
        r"malignan\w+",
        r"carcinoma\w*",
        r"metasta\w+",
        r"cancer",
    ),
    "Edema": (r"(?<!soft tissue )(?<!soft tissues )o?edema(?:tous)?",),
    "Consolidation": (r"consolidat\w*",),
    "Pneumonia": (r"pneumoni(?:a|as|ae|tis)", r"bronchopneumonia", r"pnuemonia", r"penumonia"),
    "Atelectasis": (
        r"atelecta\w*",
        r"(?:lobar|lung|lobe|segmental) collapse",
        r"collapsed? (?:of the )?(?:right |left )?(?:lung|lobe|upper lobe|lower lobe|middle lobe)",
        # "partial collapse of the left upper and lower lobes", "collapse of a substantial portion of the left lung"
        r"collapse of (?:an? |the )?(?:\w+ )?(?:portion of )?(?:the )?(?:right |left )?"
        r"(?:(?:upper|middle|lower)(?: and (?:upper|middle|lower))? lobes?|lung)",
    ),
    "Pneumothorax": (r"pneumothora(?:x|ces|xes)", r"pnuemothorax", r"pneumothorx", r"ptx"),
    "Pleural Effusion": (
        r"(?<!pericardial )(?<!joint )(?:pleural )?effusions?",
        r"pleural fusions?",
        r"pleural fluid",
        r"hydrothora(?:x|ces)",
        r"fluid (?:in|within) the (?:\w+ )?(?:pleural space|fissure)s?",
    ),
    "Pleural Other": (
        r"pleural (?:plaques?|calcifications?|scar(?:ring)?)",
        r"fibrothorax",
        r"calcified pleura\w*",
        r"pleural[\s-]parenchymal (?:scar(?:ring)?|opacit\w+|thickening)",
    ),
    "Fracture": (r"fractur\w*", r"fx"),
    "Support Devices": (
        r"pacemakers?",
        r"pacer",
        r"(?:aicd|icd)",
        r"(?:cardiac )?defibrillator",
        r"(?:endotracheal|et|tracheostomy|trach|nasogastric|ng|og|orogastric|feeding|chest|enteric|dobhoff) tubes?",
        r"(?:picc|central venous|central|venous|midline|swan[\s-]ganz|dialysis|jugular|subclavian) (?:lines?|catheters?)",
        r"(?:ij|internal jugular|subclavian|femoral) (?:central )?(?:venous )?(?:lines?|catheters?|cvc)",
        r"picc",
        r"cvc",
        r"ett",
        r"ngt|ogt",
        r"dobhoff",
        r"swan[\s-]ganz",
        r"catheters?",
        r"port[\s-]?a[\s-]?cath",
        r"(?:chest |power |infusion )?port",
        r"(?:sternotomy|sternal) (?:wires?|sutures?)",
        r"(?:pacing |pacemaker )?leads?",
        r"stents?",
        r"(?:surgical )?clips",
        r"prosthetic (?:valve|mitral|aortic)\w*",
        r"valve (?:replacement|prosthesis)",
        r"tracheostomy",
        r"(?:support )?devices?",
        r"hardware",
        r"drains?",
    ),
    "Nodule": (r"nodules?",),
    "Mass": (r"mass(?:es)?(?! effect)", r"masslike", r"mass-like"),
    "Infiltration": (r"infiltrat\w*",),
    # Air in the soft tissues or mediastinum is not the lung disease; cystic fibrosis is a disease, not a fibrosis finding.
    "Emphysema": (r"(?<!subcutaneous )(?<!mediastinal )(?<!soft tissue )(?:emphysema\w*|emphysematous)",),
    "Fibrosis": (r"(?<!cystic )(?:fibros\w*|fibrotic)",),
    # The fissures are pleura: a thickened fissure is pleural thickening, and so is an apical cap.
    "Pleural Thickening": (
        r"pleural thicken\w*",
        r"thicken(?:ed|ing) (?:of (?:the )?)?pleura\w*",
        r"pleural-based thickening",
        r"(?:fissural|interlobar fissural|pleuroparenchymal) thickening",
        r"thicken(?:ed|ing) (?:of |in )?(?:the )?(?:\w+ )?fissures?",
        r"thickened (?:\w+ )?fissures?",
        r"apical (?:pleural )?(?:capping|caps?)",
    ),
    "Hernia": (r"hernia\w*",),
}

# Anatomy named with a qualifier that decides the finding: "heart size is normal" denies
# cardiomegaly, "the heart is enlarged" asserts it. concept -> (anatomy, enlarged words or None, normal words).
SIZE_ANATOMY: dict[str, tuple[str, str | None, str]] = {
    "Cardiomegaly": (
        r"heart(?: size)?|cardiac (?:silhouette|size|shadow|contours?)|heart silhouette",
        r"enlarged|enlargement|large|mildly enlarged|prominent|increased|upper limits? (?:of )?normal|top normal|borderline",
        r"normal|within normal limits|unremarkable|not (?:significantly |markedly |grossly )?enlarged|normal in size|negative|small",
    ),
    "Enlarged Cardiomediastinum": (
        r"(?:cardio)?mediastinal (?:silhouette|contours?|size|width)|mediastinum|cardiomediastinum",
        r"enlarged|widened|wide|prominent|increased",
        r"normal|within normal limits|unremarkable|not widened|stable|negative",
    ),
    # "The lungs are clear" denies a parenchymal opacity, as a radiologist reads it; it says
    # nothing about the pleura or the heart, and no finer observation (edema, consolidation)
    # is denied by it, so that a later "mild edema" in the same report is not contradicted.
    "Lung Opacity": (
        r"lungs?|lung fields|lung parenchyma",
        None,
        r"clear(?! evidence)",
    ),
}

# Negation that comes before the finding and covers the rest of its clause ("no effusion, pneumothorax or ...").
PRE_NEGATION = (
    r"no",
    r"not",
    r"without",
    r"free of",
    r"negative for",
    r"absence of",
    r"absent",
    r"no evidence of",
    r"no signs? of",
    r"nor",
    r"neither",
    r"resolution of",
    r"resolved",
    r"clear of",
    r"removal of",
    r"no longer",
    r"interval removal of",
    r"rather than",
    r"never",
)

# Negation that comes after the finding and covers what precedes it in the clause. Each
# starts with its own word ("not seen", not "is not seen"): a leading optional word would make
# the matcher try every position of the report.
POST_NEGATION = (
    r"not (?:seen|identified|present|visualized|demonstrated|evident|appreciated|noted|detected|visible|apparent|enlarged|widened)",
    r"absent",
    r"(?:since )?(?:resolved|cleared|been removed|been resolved|resolution)",
    r"no longer (?:seen|present|visualized|identified|evident|apparent|visible|noted)",
    r"(?:was|were|has been|have been) removed",
    r"negative(?! for)",
    r"unlikely",
)

# Phrases that look like negation but are not: "no change in the cardiomegaly" asserts cardiomegaly.
PSEUDO_NEGATION = (
    r"no (?:significant |interval |appreciable |substantial )*(?:change|increase|worsening|progression)",
    r"not (?:significantly |substantially )?(?:changed|increased|worsened|progressed)",
    r"without (?:significant |interval |appreciable |substantial )*(?:change|increase|worsening|progression)",
    r"not only",
    r"no longer (?:enlarged|widened)",
    r"not (?:entirely |totally |completely )?(?:excluded|ruled out)",
    r"no new",
    r"not well (?:seen|visualized)",
    # a finding partly resolved is still there
    r"(?:partial(?:ly)?|partly|nearly|almost|mostly|incompletely) resol\w*",
    r"not (?:completely|entirely|fully|yet) resolved",
)

# Uncertainty before the finding ("possible pneumonia") or after it ("pneumonia is possible").
PRE_UNCERTAINTY = (
    r"may(?: be| represent| reflect)?",
    r"maybe",
    r"might",
    r"could",
    r"can",
    r"possibl[ey]",
    r"probabl[ey]",
    r"(?<!less )likely",
    r"question(?: of)?",
    r"questionable",
    r"suspicious (?:for|of)",
    r"suspect(?:ed)?",
    r"suggest(?:s|ed|ive|ing)?(?: of)?",
    r"concerning (?:for|of)",
    r"concern for",
    r"worrisome for",
    r"rule[\s-]out",
    r"r/o",
    r"differential(?: diagnosis| considerations?)? (?:includes?|of)",
    r"differential diagnos[ie]s",
    r"(?:primary )?differential considerations? (?:would )?includes?",
    r"considerations? (?:would )?includes?",
    r"(?:evaluation|evaluate|assess|assessment) for",
    r"less likely",
    r"most likely",
    r"most (?:suggestive|compatible|consistent) (?:of|with)",
    r"consider(?:ed)?",
    r"favou?r(?:s|ed|ing)?",
    r"cannot exclude",
    r"can ?not rule out",
    r"equivocal",
    r"indeterminate",
    r"presum(?:ed|ably|ptive)",
    r"apparent",
    r"versus",
    r"vs\.?",
    r"either",
    r"poss",
    r"perhaps",
    r"atypical",
    r"early",
    r"developing",
    r"would be difficult to exclude",
    r"(?:correlate|correlation) (?:clinically )?for",
    r"clinical correlation for",
)

POST_UNCERTAINTY = (
    r"(?:cannot|can ?not|could not|can't|not) (?:be )?(?:entirely |totally |completely |definitely )?(?:excluded|ruled out|be excluded)",
    r"(?:entirely |totally |completely )?excluded",
    r"(?:possible|probable|likely|suspected|questioned|favou?red)",
    r"versus",
    r"vs\.?",
    r"(?:(?:is|are) (?:also )?(?:a |the )?|a |the )(?:differential|consideration)",
    r"difficult to (?:entirely |completely )?exclude",
)

# Hedges that still lean to "present" (the ACR likelihood lexicon puts them near 75%): the
# fact stays uncertain, and carries certainty "probable" instead of "possible".
PROBABLE_HEDGES = (
    r"probabl[ey]",
    r"(?:most )?likely",
    r"favou?r(?:s|ed|ing)?",
    r"most (?:suggestive|compatible|consistent) (?:of|with)",
    r"presum(?:ed|ably|ptive)",
)

# Words that close a clause: a negation or hedge does not reach past them.
SCOPE_TERMINATORS = (
    r"but",
    r"however",
    r"although",
    r"though",
    r"though there",
    r"which",
    r"whereas",
    r"otherwise(?= (?:no|negative|without|free))",
    r"while",
    r"except(?: for)?",
    r"aside from",
    r"apart from",
    r"other than",
    r"there (?:is|are|has been|have been)",
    r"(?:is|are|was|were) (?:seen|noted|present|identified|again seen|demonstrated|unchanged|stable)",
    r"likely",
    r"probably",
    r"possibly",
    r"may",
    r"that",
    r"status post",
    r"s/p",
)

# Words that open a new positive assertion when they start a segment after a comma, "and" or
# "with": "No pneumothorax, small effusion." asserts the effusion. A plain list keeps the
# negation ("no effusion, pneumothorax, or consolidation"), and so does a list of modified
# findings that goes on to an "or"/"nor" ("no consolidation, large effusion, or pneumothorax"),
# which only reads as one denial.
ASSERTION_OPENERS = (
    r"a",
    r"an",
    r"the",
    r"there",
    r"\d+(?:\.\d+)?",
    r"(?:tiny|trace|minimal|small|mild|mildly|moderate|moderately|large|severe|severely|extensive|marked|markedly)",
    r"(?:new|newly|increas\w*|enlarging|worse\w*|progressi\w*|persistent|persisting|stable|unchanged|chronic|residual|decreas\w*|improv\w*)",
    # "Effusions, right greater than left" goes on describing the effusions; it asserts nothing new.
    r"(?:(?:left|right)(?! (?:greater|larger|more|worse) than)|bilateral|bibasila\w*|bibasal|biapical)",
)

# Attributes worth showing beside a highlighted fact. Laterality, severity and change are read from
# the word nearest the mention in its clause (see `extract._attributes`); location from the
# first-listed value found near it. A support device's tip position is read apart (`facts.devices`).
_NOT_HEART = r"(?![\s-]+(?:atri\w*|ventric\w*|heart|sided heart))"
ATTRIBUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "laterality": (
        # "right greater than left" is both sides; "right atrium" is no side of the chest.
        (
            r"bilateral(?:ly)?|both|bibasila\w*|bibasal|biapical|(?:right|left)[\s-]+(?:greater|larger|more|worse) than (?:the )?(?:left|right)",
            "bilateral",
        ),
        (r"right[\s-]sided|right" + _NOT_HEART + r"|rt", "right"),
        (r"left[\s-]sided|left" + _NOT_HEART + r"|lt|lingula\w*", "left"),  # the lingula is the left lung's
    ),
    "location": (
        (r"upper lobes?|upper lung zones?|upper lungs?|apex|apices|apical", "upper"),
        (r"middle lobe|lingula\w*", "middle"),
        (r"lower lobes?|lower lung zones?|bases?|basilar|basal|bibasilar|infrahilar", "lower"),
        (r"perihilar|hilar|hila", "hilar"),
        (r"retrocardiac", "retrocardiac"),
        (r"costophrenic", "costophrenic"),
    ),
    # A range ("small to moderate") is one value; "no significant change" is no severity.
    "severity": (
        (r"(?:tiny|trace|minimal|small)(?:\s+to\s+|\s*-\s*)moderate(?:[\s-]sized?)?", "small to moderate"),
        (r"mild(?:ly)?(?:\s+to\s+|\s*-\s*)moderate(?:ly)?", "mild to moderate"),
        (r"moderate(?:\s+to\s+|\s*-\s*)large(?:[\s-]sized?)?", "moderate to large"),
        (r"moderate(?:ly)?(?:\s+to\s+|\s*-\s*)(?:severe|severely|marked|markedly)", "moderate to severe"),
        (r"tiny|trace|minimal|minimally|subtle|slight|small(?:[\s-]sized?)?", "small"),
        (r"mild|mildly", "mild"),
        (r"moderate(?:[\s-]sized?)?|moderately", "moderate"),
        (
            r"large(?:[\s-]sized?)?|extensive|massive|sizable|sizeable|substantial"
            r"|(?<!no )(?<!not )(?<!without )(?<!no other )significant",
            "large",
        ),
        (r"severe|severely|marked|markedly", "severe"),
    ),
    # Temporal change since the prior study. "Persistent" only says the finding was there before, so it
    # agrees with any change of size but not with "new" (see CHANGE_CONFLICTS); "increased" here is never
    # the "increased density" or "increased markings" that name an opacity rather than a change.
    "change": (
        (
            r"(?<!no )(?<!not )(?<!without )(?:new|newly)|developing|interval (?:development|appearance)"
            r"|(?:has|have) (?:developed|appeared)",
            "new",
        ),
        (
            r"no (?:significant |interval |appreciable |substantial )*(?:change|increase|worsening|progression)"
            r"|not (?:significantly |substantially )?(?:changed|increased|worsened|progressed)"
            r"|without (?:significant |interval |appreciable |substantial )*(?:change|increase|worsening|progression)"
            r"|unchanged|stable|similar",
            "unchanged",
        ),
        (
            r"increas\w*(?! (?:densit|interstiti|opacit|markings|lung volume|attenuation|ap diameter|lucenc|retrocardiac))"
            r"|worse\w*|worsen\w*|progress\w*|enlarging|(?:slightly |mildly )?larger(?! than (?:the )?(?:left|right))",
            "increased",
        ),
        (
            r"(?:partial(?:ly)?|partly|nearly|almost|mostly|incompletely) resol\w*|not (?:completely|entirely|fully|yet) resolved"
            r"|decreas\w*|improv\w*|resolving|smaller"
            r"|diminish\w*|regress\w*|less prominent|lessened|clearing",
            "decreased",
        ),
        (r"resolved|resolution|cleared|no longer (?:seen|visible|present|identified|evident|apparent)", "resolved"),
        (
            r"persistent|persists|persisting|chronic|residual|again (?:seen|noted|demonstrated)|redemonstrat\w*|remains?"
            r"|old|healed|known",
            "persistent",
        ),
    ),
}

# Changes two readers cannot both have seen. "New" and "increased" agree (both say it got worse; readers
# use them alike), and "persistent" agrees with any change of size; a change one reader leaves unsaid
# agrees with any. A resolved finding is denied, so polarity, not this table, judges it.
CHANGE_CONFLICTS: frozenset[frozenset[str]] = frozenset(
    frozenset(pair)
    for pair in (
        ("new", "unchanged"),
        ("new", "decreased"),
        ("new", "persistent"),
        ("new", "resolved"),
        ("increased", "decreased"),
        ("increased", "unchanged"),
        ("increased", "resolved"),
        ("decreased", "unchanged"),
        ("unchanged", "resolved"),
        ("persistent", "resolved"),
    )
)

# Severity as grades, for telling "clearly different" from "a reader's rounding": small and mild are
# one grade (effusions are small, hearts mildly enlarged), moderate the next, large and severe the
# last; a range spans its two grades. Two severities contradict each other only when their grades
# are two or more apart (small vs large, mild vs severe): small vs moderate is the same finding
# called by two readers, not a disagreement.
SEVERITY_GRADES: dict[str, tuple[int, int]] = {
    "small": (1, 1),
    "mild": (1, 1),
    "small to moderate": (1, 2),
    "mild to moderate": (1, 2),
    "moderate": (2, 2),
    "moderate to large": (2, 3),
    "moderate to severe": (2, 3),
    "large": (3, 3),
    "severe": (3, 3),
}
SEVERITY_CONTRADICTION_GAP = 2

# The kind of a support device, read from its mention: the first type whose pattern the mention
# contains. A line is not a tube: an "IJ central line" in the draft and only an "endotracheal tube"
# in the report disagree. Generic mentions ("catheter", "drain", "support devices", "hardware")
# get no type and agree with any device.
DEVICE_TYPES: tuple[tuple[str, str], ...] = (
    (r"endotracheal|et tubes?|ett", "endotracheal tube"),
    (r"tracheostomy|trach", "tracheostomy tube"),
    (r"nasogastric|orogastric|ng|og|ngt|ogt|feeding|enteric|dobhoff", "enteric tube"),
    (r"chest tubes?", "chest tube"),
    (
        r"picc|central|venous|cvc|ij|internal jugular|jugular|subclavian|femoral|midline|swan[\s-]ganz|dialysis"
        r"|port[\s-]?a[\s-]?cath|port",
        "central line",
    ),
    (r"pacemakers?|pacer|pacing|aicd|icd|defibrillator|leads?", "pacemaker"),
    (r"sternotomy|sternal", "sternotomy wires"),
    (r"clips", "surgical clips"),
    (r"stents?", "stent"),
    (r"valve|prosthetic", "valve prosthesis"),
)
