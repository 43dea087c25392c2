"""The rule-based fact extractor: mentions, their polarity and attributes, per sentence.

Unlike NegBio or the CheXpert labeler there is no parser here: scope comes from
clause terminators and list structure, which is what radiology prose mostly
uses, and keeps labelling at thousands of reports a second on one core with the
standard library only. Each regular expression runs once over the whole report;
every decision after that is bisection over sorted spans.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orapo_core.facts import vocabulary as V
from orapo_core.facts.devices import MALPOSITIONED, POSITIONED_DEVICES, placement, tip_position
from orapo_core.facts.ontology import CONCEPTS, project, schema_labels
from orapo_core.facts.text import Sentence, split_sentences

POSITIVE, NEGATIVE, UNCERTAIN = "positive", "negative", "uncertain"
LABEL_VALUE = {POSITIVE: 1, NEGATIVE: 0, UNCERTAIN: -1}


@dataclass(frozen=True)
class Fact:
    observation: str
    polarity: str
    attributes: dict[str, str]
    sentence_index: int
    start: int
    end: int
    mention: str
    # A finding a reader must hear of at once: today a support device whose tip is malpositioned
    # (`attributes["position"]`, judged by `facts.devices.placement`).
    critical: bool = False


@dataclass
class ReportFacts:
    text: str
    sentences: list[Sentence]
    facts: list[Fact] = field(default_factory=list)

    def labels(self, schema: str = "chexpert") -> dict[str, int | None]:
        return labels_from_facts(self.facts, schema)


def _alt(patterns: Iterable[str]) -> str:
    return "|".join(sorted(patterns, key=len, reverse=True))


def _words(patterns: Iterable[str]) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])(?:" + _alt(patterns) + r")(?![\w-])")


# Specific concepts first, so that at one position "pleural thickening" beats a broader reading.
_CONCEPT_ORDER = sorted(
    CONCEPTS, key=lambda c: c not in ("Pleural Thickening", "Pleural Other", "Nodule", "Mass", "Infiltration")
)
_GROUP_TO_CONCEPT = {f"c{i}": c for i, c in enumerate(_CONCEPT_ORDER)}
_MENTION_RE = re.compile(
    r"(?<![\w-])(?:"
    + "|".join(f"(?P<c{i}>{_alt(V.MENTIONS[c])})" for i, c in enumerate(_CONCEPT_ORDER))
    + r")(?![\w-])"
)
_PRE_NEG = _words(V.PRE_NEGATION)
_POST_NEG = _words(V.POST_NEGATION)
_PSEUDO = _words(V.PSEUDO_NEGATION)
_PRE_UNC = _words(V.PRE_UNCERTAINTY)
_POST_UNC = _words(V.POST_UNCERTAINTY)
_TERMINATOR = re.compile(r"[;:]|(?<![\w-])(?:" + _alt(V.SCOPE_TERMINATORS) + r")(?![\w-])")
_OPENER = re.compile(
    r"(?:,|(?<![\w-])(?:and|(?<!consistent )(?<!compatible )with)(?![\w-]))\s*(?:"
    + _alt(V.ASSERTION_OPENERS)
    + r")(?![\w-])"
)
# The rest of a clause that goes on to "or"/"nor" is one list under one negation.
_LIST_TAIL = re.compile(r"[^.;:\n]*?(?<![\w-])n?or(?![\w-])")
# So is a differential: "differential diagnosis includes atelectasis, small infiltrate, scarring".
_LIST_HEAD = re.compile(r"differential|consideration|includ")
# Residual hedges decided by the strongest phrases: these beat a negation in the same clause.
_STRONG_UNCERTAINTY = re.compile(r"exclude|ruled? out|r/o")
_PROBABLE = re.compile(r"(?:is |are )?(?:" + _alt(V.PROBABLE_HEDGES) + r")$")
# "A versus B", "either A or B": alternatives named side by side.
_VERSUS = re.compile(r"versus|vs\b|either")
_SIZE_CONCEPTS = list(V.SIZE_ANATOMY)
# Every organ in one scan; the group says which concept its qualifier decides.
_ANATOMY_RE = re.compile(
    r"(?<![\w-])(?:"
    + "|".join(f"(?P<a{i}>{V.SIZE_ANATOMY[c][0]})" for i, c in enumerate(_SIZE_CONCEPTS))
    + r")(?![\w-])"
)
_QUALIFIER_RES = {
    f"a{i}": (
        concept,
        re.compile(
            r"(?<![\w-])(?:(?P<normal>"
            + normal
            + r")"
            + (r"|(?P<enlarged>" + enlarged + r")" if enlarged else "")
            + r")(?![\w-])"
        ),
    )
    for i, (concept, (_, enlarged, normal)) in enumerate(V.SIZE_ANATOMY.items())
}
_HEDGED_SIZE = re.compile(r"upper limits? (?:of )?normal|top normal|prominent")
# One regex per attribute, one group per value: the first-listed value found near a mention wins.
_ATTRIBUTE_RES = {
    name: (
        re.compile(
            r"(?<![\w-])(?:"
            + "|".join(f"(?P<v{i}>{pattern})" for i, (pattern, _) in enumerate(options))
            + r")(?![\w-])"
        ),
        {f"v{i}": (i, value) for i, (_, value) in enumerate(options)},
    )
    for name, options in V.ATTRIBUTES.items()
}
# Attributes a reference report is checked against: read from the word nearest the mention, never across another finding.
_NEAREST_ATTRIBUTES = frozenset({"laterality", "severity", "change"})
# Devices in the midline: a side near them is their tip's ("ETT in the right mainstem bronchus"), read as position.
_MIDLINE_DEVICES = frozenset({"endotracheal tube", "tracheostomy tube", "enteric tube"})
_DEVICE_RES = [(re.compile(r"(?<![\w-])(?:" + pattern + r")(?![\w-])"), kind) for pattern, kind in V.DEVICE_TYPES]


class _Spans:
    """Sorted (start, end, text) matches of one trigger class, searchable by position."""

    __slots__ = ("starts", "items")

    def __init__(self, regex: re.Pattern, text: str, drop: list[tuple[int, int]] | None = None):
        items = [(m.start(), m.end(), m.group()) for m in regex.finditer(text)]
        if drop:
            items = [it for it in items if not any(a <= it[0] < b for a, b in drop)]
        self.items = items
        self.starts = [it[0] for it in items]

    def between(self, lo: int, hi: int) -> list[tuple[int, int, str]]:
        return self.items[bisect_left(self.starts, lo) : bisect_left(self.starts, hi)]


def _terminators(lower: str) -> _Spans:
    """Clause boundaries: terminator words, and segments that open a new assertion."""
    terms = _Spans(_TERMINATOR, lower)
    openers = [
        (m.start(), m.end(), m.group()) for m in _OPENER.finditer(lower) if not _in_list(lower, m.start(), m.end())
    ]
    if openers:
        terms.items = sorted(terms.items + openers)
        terms.starts = [it[0] for it in terms.items]
    return terms


def _in_list(lower: str, start: int, end: int) -> bool:
    if _LIST_TAIL.match(lower, end):
        return True
    head = max(
        lower.rfind(".", 0, start), lower.rfind(";", 0, start), lower.rfind(":", 0, start), lower.rfind("\n", 0, start)
    )
    return _LIST_HEAD.search(lower, head + 1, start) is not None


def _clause(terms: _Spans, sentence: Sentence, start: int, end: int) -> tuple[int, int]:
    """The clause around a mention: from the last terminator before it to the first after it."""
    left = sentence.start
    before = terms.between(sentence.start, start)
    if before:
        left = before[-1][0]
    after = terms.between(end, sentence.end)
    right = after[0][0] if after else sentence.end
    return left, right


def _group(m: re.Match[str]) -> str:
    """The named group a match of one of the patterns above matched (each of their alternatives is one)."""
    assert m.lastgroup is not None
    return m.lastgroup


def _polarity(
    text: str, spans: dict[str, _Spans], sentence: Sentence, start: int, end: int, clause: tuple[int, int]
) -> tuple[str, str | None]:
    """(polarity, certainty): certainty is 'probable', 'alternative' or 'possible' for an uncertain fact, else None."""
    left, right = clause
    pre_neg = [t for t in spans["pre_neg"].between(left, start) if t[1] <= start]
    post_neg = spans["post_neg"].between(end, right)
    pre_unc = [t for t in spans["pre_unc"].between(left, start) if t[1] <= start]
    # "A versus B" hedges the alternative right before it, not everything earlier in the clause.
    post_unc = [
        t for t in spans["post_unc"].between(end, right) if not _VERSUS.match(t[2]) or _next_to(text, end, t[0])
    ]
    uncertain = pre_unc + post_unc
    if any(_STRONG_UNCERTAINTY.search(t[2]) for t in uncertain):
        return UNCERTAIN, "possible"
    if pre_neg or post_neg:
        return NEGATIVE, None
    if uncertain:
        # "A versus B", "either A or B" name alternatives the radiologist could not choose between;
        # with a high-likelihood word as well ("likely A versus B") it reads "probable".
        versus = [t for t in uncertain if _VERSUS.match(t[2])]
        if len(versus) == len(uncertain):
            return UNCERTAIN, "alternative"
        if all(_PROBABLE.match(t[2]) for t in uncertain if t not in versus):
            return UNCERTAIN, "probable"
        return UNCERTAIN, "possible"
    return POSITIVE, None


def _next_to(text: str, end: int, start: int) -> bool:
    gap = text[end:start]
    return len(gap) <= 25 and "," not in gap


def _attributes(
    text: str,
    left: int,
    right: int,
    start: int,
    end: int,
    barriers: Sequence[tuple[int, int]] = (),
    sentence_end: int | None = None,
) -> dict[str, str]:
    # Attributes live next to the mention: "small left pleural effusion", "effusion on the right".
    lo, hi = max(left, start - 40), min(right, end + 30)
    found: dict[str, str] = {}
    for name, (regex, values) in _ATTRIBUTE_RES.items():
        if name in _NEAREST_ATTRIBUTES:
            value = _nearest(regex, values, text, lo, hi, start, end, barriers)
            if value is None and name == "change" and sentence_end is not None and right == hi:
                value = _trailing_change(text, right, sentence_end, barriers)
            if value is not None:
                found[name] = value
            continue
        best = None
        for m in regex.finditer(text, lo, hi):
            option = values[_group(m)]
            if best is None or option < best:
                best = option
        if best is not None:
            found[name] = best[1]
    return found


_TRAILING = re.compile(r"[,\s]*(?:and\s+)?(?:(?:is|are|was|were|has been|have been|appears?|remains?)\s+)?")


def _trailing_change(text: str, right: int, sentence_end: int, barriers: Sequence[tuple[int, int]]) -> str | None:
    """A change said after the finding's clause, which it opened anew: "Left effusion, increased since the prior",
    "the opacity is unchanged".

    Taken only when no other finding follows it before the next comma: in "effusion, increased opacity" it is the opacity's.
    """
    regex, values = _ATTRIBUTE_RES["change"]
    lead = _TRAILING.match(text, right, sentence_end)
    m = regex.match(text, lead.end() if lead else right, sentence_end)
    if m is None:
        return None
    stop = text.find(",", m.end(), sentence_end)
    stop = sentence_end if stop < 0 else stop
    if any(m.end() <= s < stop for s, _ in barriers):
        return None
    return values[_group(m)][1]


def _nearest(
    regex: re.Pattern[str],
    values: dict[str, tuple[int, str]],
    text: str,
    lo: int,
    hi: int,
    start: int,
    end: int,
    barriers: Sequence[tuple[int, int]],
) -> str | None:
    """The value written inside the mention's span, else the nearest before it, else the nearest after it.

    A word with another finding between it and the mention belongs to that finding: in "large right
    effusion with atelectasis" the atelectasis has neither a side nor a size.
    """
    inside: re.Match[str] | None = None
    before: re.Match[str] | None = None
    after: re.Match[str] | None = None
    for m in regex.finditer(text, lo, hi):
        a, b = m.span()
        if a >= start and b <= end:
            inside = inside or m
        elif b <= start:
            if not any(b <= s and e <= start for s, e in barriers):
                before = m
        elif a >= end and after is None:
            if not any(end <= s and e <= a for s, e in barriers):
                after = m
    found = inside or before or after
    return values[_group(found)][1] if found is not None else None


def _device(mention: str) -> str | None:
    lower = mention.lower()
    return next((kind for regex, kind in _DEVICE_RES if regex.search(lower)), None)


def _sentence_at(starts: list[int], sentences: list[Sentence], pos: int) -> Sentence | None:
    i = bisect_right(starts, pos) - 1
    if i >= 0 and pos < sentences[i].end:
        return sentences[i]
    return None


def extract_facts(text: str) -> ReportFacts:
    """Atomic facts of a report: (observation, polarity, attributes, sentence, span)."""
    return _extract(text, attributes=True)


def _extract(text: str, attributes: bool) -> ReportFacts:
    # Labels need only polarity: `label_report` skips the attribute search, about a quarter of the work.
    text = text or ""
    sentences = split_sentences(text)
    report = ReportFacts(text=text, sentences=sentences)
    if not sentences:
        return report
    lower = text.lower()
    pseudo = [(m.start(), m.end()) for m in _PSEUDO.finditer(lower)]
    spans = {
        "pre_neg": _Spans(_PRE_NEG, lower, pseudo),
        "post_neg": _Spans(_POST_NEG, lower, pseudo),
        "pre_unc": _Spans(_PRE_UNC, lower),
        "post_unc": _Spans(_POST_UNC, lower),
    }
    terms = _terminators(lower)
    starts = [s.start for s in sentences]

    mentions: list[tuple[int, int, str, Sentence]] = []
    for m in _MENTION_RE.finditer(lower):
        sentence = _sentence_at(starts, sentences, m.start())
        if sentence is None or sentence.section in V.NON_FINDING_SECTIONS:
            continue
        mentions.append((m.start(), m.end(), _GROUP_TO_CONCEPT[_group(m)], sentence))

    facts: list[Fact] = []
    barriers = [(m[0], m[1]) for m in mentions]
    for i, (start, end, concept, sentence) in enumerate(mentions):
        clause = _clause(terms, sentence, start, end)
        polarity, certainty = _polarity(lower, spans, sentence, start, end, clause)
        found = _attributes(lower, *clause, start, end, barriers, sentence.end) if attributes else {}
        critical = False
        if attributes and concept == "Support Devices":
            device = _device(text[start:end])
            if device:
                found["device"] = device
            if device in POSITIONED_DEVICES:
                # The tip is described after the mention, before the sentence's next finding.
                bound = mentions[i + 1][0] if i + 1 < len(mentions) and mentions[i + 1][3] is sentence else sentence.end
                position = tip_position(lower, end, bound)
                if device in _MIDLINE_DEVICES:
                    found.pop("laterality", None)
                if position:
                    found["position"] = position
                    critical = polarity != NEGATIVE and placement(device, position, text[start:end]) == MALPOSITIONED
        if certainty:
            found["certainty"] = certainty
        facts.append(Fact(concept, polarity, found, sentence.index, start, end, text[start:end], critical))
    facts.extend(_size_facts(text, lower, sentences, terms, spans, mentions, attributes))
    facts.sort(key=lambda f: (f.start, f.observation))
    report.facts = facts
    return report


def _size_facts(
    text: str,
    lower: str,
    sentences: list[Sentence],
    terms: _Spans,
    spans: dict[str, _Spans],
    mentions: list[tuple[int, int, str, Sentence]],
    with_attributes: bool = True,
) -> list[Fact]:
    """Facts read from an organ and its qualifier: "heart size is normal", "the mediastinum is widened"."""
    taken_starts = [m[0] for m in mentions]
    barriers = [(m[0], m[1]) for m in mentions]
    facts: list[Fact] = []
    starts = [s.start for s in sentences]
    for m in _ANATOMY_RE.finditer(lower):
        start, end = m.span()
        i = bisect_right(taken_starts, start) - 1
        if i >= 0 and start < mentions[i][1]:
            continue
        concept, qualifier_re = _QUALIFIER_RES[_group(m)]
        sentence = _sentence_at(starts, sentences, start)
        if sentence is None or sentence.section in V.NON_FINDING_SECTIONS:
            continue
        left, right = _clause(terms, sentence, start, end)
        # "Heart and mediastinum are normal": the qualifier may follow a short conjunction.
        # The qualifier follows within the clause, before any comma ("stable heart size, enlarged aorta").
        comma = lower.find(",", end, sentence.end)
        q = qualifier_re.search(lower, end, min(right, end + 60, comma if comma >= 0 else sentence.end))
        if q is None:
            q = qualifier_re.search(lower, max(left, start - 30), start)
        if q is None:
            continue
        attributes = _attributes(lower, left, right, start, q.end(), barriers, sentence.end) if with_attributes else {}
        if q.group("normal"):
            polarity = NEGATIVE
        elif _HEDGED_SIZE.search(q.group()):
            polarity, attributes["certainty"] = UNCERTAIN, "possible"
        else:
            polarity, certainty = _polarity(lower, spans, sentence, start, end, (left, right))
            if certainty:
                attributes["certainty"] = certainty
        facts.append(Fact(concept, polarity, attributes, sentence.index, start, end, text[start:end]))
    return facts


# Hedged findings a schema's own labels code as present. The CheXpert labeler writes every hedge as
# uncertain (-1). ChestX-ray14's labels are binary, and the human coders of its Open-i gold standard
# (NegBio) code a finding called probable ("likely atelectasis") and both alternatives of "A versus B",
# but mostly not a possible one ("may represent pneumonia"): in that schema those two are written 1.
CODED_HEDGES: dict[str, frozenset[str]] = {
    "chexpert": frozenset(),
    "chestxray14": frozenset({"probable", "alternative"}),
}


def labels_from_facts(facts: Iterable[Fact], schema: str = "chexpert") -> dict[str, int | None]:
    """CheXpert-labeler aggregation: a positive anywhere wins, then uncertain, then negative.

    A hedge the schema codes as present (`CODED_HEDGES`) counts as positive.
    """
    names = schema_labels(schema)
    coded = CODED_HEDGES.get(schema, frozenset())
    rank = {None: 0, 0: 1, -1: 2, 1: 3}
    labels: dict[str, int | None] = {name: None for name in names}
    abnormal = False
    for fact in facts:
        value = LABEL_VALUE[fact.polarity]
        if value == -1 and (fact.attributes or {}).get("certainty") in coded:
            value = 1
        if value != 0 and fact.observation != "Support Devices":
            abnormal = True
        name = project(fact.observation, schema)
        if name is not None and rank[value] > rank[labels[name]]:
            labels[name] = value
    if schema == "chexpert":
        labels["No Finding"] = None if abnormal else 1
    return labels


def label_report(text: str, schema: str = "chexpert") -> dict[str, int | None]:
    """One report's labels in `schema`: 1 positive, 0 negative, -1 uncertain, None not mentioned.

    In "chestxray14" a probable finding and the alternatives of "A versus B" are 1, a possible one -1
    (`CODED_HEDGES`); in "chexpert" every hedged finding is -1, as the CheXpert labeler writes it.
    """
    schema_labels(schema)
    return labels_from_facts(_extract(text, attributes=False).facts, schema)
