"""Where a tube or line ends: the tip position of a support device, and whether it is a malposition.

A device's position is read from the words after its mention, up to the end of the sentence, the next
finding, or a recommendation ("should be retracted to 4 cm above the carina" names where it should be,
not where it is: the recommendation itself reads as a malposition when no position precedes it). A
location the tube only passes ("courses through the esophagus into the stomach") is a path, not its
tip, so the last location named wins; a finer one of the same place beats a broad one ("below the
carina in the right mainstem bronchus"). Whether a position is right depends on the device: the
trachea is where an endotracheal tube belongs and where an enteric tube must never be. Two positions
agree when they are one place said two ways, or neighbouring places both right or both wrong for the
device ("4 cm above the carina" and "in the mid trachea"; "lower SVC" and "cavoatrial junction").
"""

from __future__ import annotations

import re

EXPECTED, MALPOSITIONED = "expected", "malpositioned"
# A position stated without a place: it agrees with any place of its own kind.
SATISFACTORY, MALPOSITION = "satisfactory", "malpositioned"

# Device types (vocabulary.DEVICE_TYPES) whose tip position is read and judged.
POSITIONED_DEVICES = frozenset({"endotracheal tube", "tracheostomy tube", "enteric tube", "central line", "chest tube"})

_NUMBER = r"(?:\d+(?:\.\d+)?|one|two|three|four|five|six|seven)\s*(?:cm|centimeters?|mm)"
# (place, pattern): a place's finer spellings first; the regex prefers the earliest alternative at a position.
POSITIONS: tuple[tuple[str, str], ...] = (
    (
        MALPOSITION,
        r"mal[\s-]?position\w*|mal[\s-]?placed|misplaced|misdirected|aberrant(?:ly)? (?:coursing|positioned|course)"
        r"|too (?:low|deep|distal|high|proximal)|(?:low|deep)[\s-]lying|not (?:adequately |sufficiently |fully )?advanced",
    ),
    (
        SATISFACTORY,
        r"(?:satisfactory|standard|good|appropriate|adequate|acceptable|expected|anatomic|proper|optimal|usual|correct)"
        r" (?:position|placement|location|positioning)"
        r"|(?:appropriately|satisfactorily|well|adequately|properly|correctly|optimally|normally) (?:positioned|placed|sited)",
    ),
    (
        "right mainstem bronchus",
        r"right (?:main[\s-]?stem |main |lower lobe |upper lobe |middle lobe )?bronch(?:us|i|ial)\w*"
        r"|right main[\s-]?stem|bronchus intermedius",
    ),
    (
        "left mainstem bronchus",
        r"left (?:main[\s-]?stem |main |lower lobe |upper lobe )?bronch(?:us|i|ial)\w*|left main[\s-]?stem",
    ),
    (
        "bronchus",
        r"(?:main[\s-]?stem )?bronch(?:us|i)|main[\s-]?stem|"
        + "(?:"
        + _NUMBER
        + r" )?(?:below|beyond|past) the carina",
    ),
    ("carina", r"(?:at|near|abutting|abuts|just above|immediately above) (?:the )?(?:level of )?(?:the )?carina"),
    (
        "trachea",
        "(?:"
        + _NUMBER
        + r" )?above the carin(?:a|al)|(?:(?:mid|midthoracic|distal|lower|upper|proximal|thoracic) )?trachea(?!l)",
    ),
    ("airway", r"airways?"),
    ("pharynx", r"(?:hypo|oro|naso)?pharyn\w*|laryn\w*|(?:the )?mouth"),
    ("gastroesophageal junction", r"gastro[\s-]?esophageal junction|ge junction|gej"),
    ("esophagus", r"(?:(?:mid|distal|proximal|upper|lower|thoracic|cervical) )?esophag(?:us|eal)"),
    ("stomach", r"stomach|gastric (?:body|fundus|antrum|lumen|bubble)|fundus|(?:left )?upper quadrant"),
    ("duodenum", r"duoden\w*|post[\s-]?pyloric|pylorus|jejun\w*"),
    (
        "below the diaphragm",
        r"(?:below|beneath|under) the (?:left )?(?:hemi)?diaphragm|subdiaphragmatic|(?:into|in) the abdomen",
    ),
    (
        "cavoatrial junction",
        r"cavo[\s-]?atrial junction|atrio[\s-]?caval junction|caj"
        r"|(?:svc|superior vena cava)[\s/-]+(?:right )?atri(?:al|um) junction"
        r"|junction of the (?:svc|superior vena cava) and (?:the )?right atrium",
    ),
    ("superior vena cava", r"(?:(?:mid|distal|proximal|lower|upper|low|high) )?(?:svc|superior vena cava)"),
    ("right atrium", r"right atri(?:um|al)"),
    ("right ventricle", r"right ventric(?:le|ular)"),
    ("brachiocephalic vein", r"(?:right |left )?(?:brachiocephalic|innominate)(?: vein)?"),
    ("internal jugular vein", r"(?:right |left )?(?:internal )?jugular(?: vein)?|ij vein|(?:into|in) the neck"),
    ("subclavian vein", r"(?:right |left )?subclavian(?: vein)?"),
    ("azygos vein", r"azygo\w*"),
    ("pulmonary artery", r"(?:main |right |left )?pulmonary (?:artery|outflow tract|trunk)"),
    ("soft tissues", r"(?:subcutaneous|chest wall|extrathoracic) (?:soft )?tissues?|extrathoracic"),
    ("apex", r"(?:lung |pleural )?ap(?:ex|ices)|apical"),
    ("base", r"(?:lung |pleural )?bases?|basilar|costophrenic"),
    ("fissure", r"(?:major |minor |oblique |horizontal )?fissure"),
)

# device -> (places where it belongs, places that are a malposition); a place in neither is neither.
PLACEMENT: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "endotracheal tube": (
        frozenset({"trachea"}),
        frozenset(
            {
                "right mainstem bronchus",
                "left mainstem bronchus",
                "bronchus",
                "carina",
                "esophagus",
                "pharynx",
                "stomach",
                "below the diaphragm",
                "gastroesophageal junction",
            }
        ),
    ),
    "tracheostomy tube": (
        frozenset({"trachea"}),
        frozenset({"right mainstem bronchus", "left mainstem bronchus", "bronchus", "carina", "soft tissues"}),
    ),
    "enteric tube": (
        frozenset({"stomach", "duodenum", "below the diaphragm"}),
        frozenset(
            {
                "trachea",
                "carina",
                "bronchus",
                "right mainstem bronchus",
                "left mainstem bronchus",
                "airway",
                "pharynx",
                "esophagus",
                "gastroesophageal junction",
            }
        ),
    ),
    "central line": (
        frozenset({"superior vena cava", "cavoatrial junction", "brachiocephalic vein"}),
        frozenset({"right atrium", "right ventricle", "internal jugular vein", "subclavian vein", "azygos vein"}),
    ),
    "chest tube": (frozenset({"apex", "base"}), frozenset({"soft tissues", "below the diaphragm", "stomach"})),
}

# Neighbouring places: said of one tip by two readers, they agree when both are right or both wrong for the device.
NEIGHBOURS: frozenset[frozenset[str]] = frozenset(
    frozenset(pair)
    for pair in (
        ("trachea", "carina"),
        ("bronchus", "right mainstem bronchus"),
        ("bronchus", "left mainstem bronchus"),
        ("bronchus", "airway"),
        ("airway", "trachea"),
        ("airway", "right mainstem bronchus"),
        ("airway", "left mainstem bronchus"),
        ("superior vena cava", "cavoatrial junction"),
        ("superior vena cava", "brachiocephalic vein"),
        ("cavoatrial junction", "right atrium"),
        ("stomach", "below the diaphragm"),
        ("duodenum", "below the diaphragm"),
        ("esophagus", "gastroesophageal junction"),
        ("esophagus", "pharynx"),
    )
)

_GROUP_TO_PLACE = {f"p{i}": place for i, (place, _) in enumerate(POSITIONS)}
_POSITION_RE = re.compile(
    r"(?<![\w-])(?:" + "|".join(f"(?P<p{i}>{pattern})" for i, (_, pattern) in enumerate(POSITIONS)) + r")(?![\w-])"
)
# Where the words stop describing the tip as it lies: a recommendation, or a comparison with another time.
_RECOMMENDATION = re.compile(
    r"(?<![\w-])(?:should|could|would|recommend\w*|suggest\w*|consider\w*|(?:can|may|might|needs?) (?:to )?be"
    r"|retraction|withdrawal|advancement|repositioning|previously|prior|compared|than)(?![\w-])"
)
_MALPOSITION_HINT = re.compile(
    r"(?<![\w-])(?:retract\w*|withdraw\w*|advanc\w*|pull(?:ed|ing)? back|reposition\w*)(?![\w-])"
)
# "courses through the esophagus", "via the left subclavian vein": a place the tube passes on its way.
_PATH = re.compile(r"(?:through|via|across|along|traverses|traversing|crosses|crossing|from)\s+(?:the\s+)?$")
_FINER = {
    "bronchus": ("right mainstem bronchus", "left mainstem bronchus"),
    "airway": ("right mainstem bronchus", "left mainstem bronchus", "bronchus"),
    "below the diaphragm": ("stomach", "duodenum"),
    "superior vena cava": ("cavoatrial junction",),
}


def tip_position(lower: str, start: int, end: int) -> str | None:
    """Where a device's tip lies, read from lower[start:end]: the words after its mention, up to the next finding."""
    cut = _RECOMMENDATION.search(lower, start, end)
    stop = cut.start() if cut else end
    places: list[str] = []
    for m in _POSITION_RE.finditer(lower, start, stop):
        if _PATH.search(lower, max(start, m.start() - 24), m.start()):
            continue
        places.append(_GROUP_TO_PLACE[m.lastgroup or ""])
    if not places:
        if cut is not None and _MALPOSITION_HINT.search(lower, cut.start(), end):
            return MALPOSITION
        return None
    specific = [p for p in places if p not in (SATISFACTORY, MALPOSITION)]
    if not specific:
        return places[-1]
    place = specific[-1]
    finer = [p for p in specific if p in _FINER.get(place, ())]
    return finer[-1] if finer else place


def placement(device: str | None, position: str | None, mention: str = "") -> str | None:
    """EXPECTED or MALPOSITIONED for a device's tip position, None when the vocabulary cannot tell.

    A dialysis catheter is meant to reach the right atrium: its `mention` says so.
    """
    if device == "central line" and position == "right atrium" and "dialysis" in mention.lower():
        return EXPECTED
    if position == SATISFACTORY:
        return EXPECTED
    if position == MALPOSITION:
        return MALPOSITIONED
    if device is None or position is None or device not in PLACEMENT:
        return None
    right, wrong = PLACEMENT[device]
    return EXPECTED if position in right else MALPOSITIONED if position in wrong else None


def positions_agree(device: str | None, a: str, b: str) -> bool:
    """Whether two readers' positions of one device can be the same tip (see the module's docstring)."""
    if a == b:
        return True
    pa, pb = placement(device, a), placement(device, b)
    if SATISFACTORY in (a, b) or MALPOSITION in (a, b):
        return pa is not None and pa == pb
    return frozenset((a, b)) in NEIGHBOURS and pa == pb
