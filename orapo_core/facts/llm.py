"""An optional fact extractor that asks an OpenAI-compatible endpoint, as the OraPO paper does.

It speaks `/v1/chat/completions` with the standard library's urllib, so a local
vLLM or Ollama server is enough and nothing is added to the install. The model
returns JSON facts; anything unusable (no server, a timeout, malformed JSON, an
unknown observation) falls back to the rule-based extractor for that report and
is counted, so a run can say how often the LLM was really used.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from orapo_core.facts.extract import NEGATIVE, POSITIVE, UNCERTAIN, Fact, ReportFacts, extract_facts
from orapo_core.facts.ontology import CONCEPTS
from orapo_core.facts.text import Sentence, split_sentences

PROMPT = (
    "You extract atomic clinical facts from a chest X-ray report. Sentences are numbered.\n"
    'Return only JSON: {{"facts": [{{"sentence": <number>, "mention": <exact words from that sentence>, '
    '"observation": <one of: {observations}>, "polarity": "positive"|"negative"|"uncertain", '
    '"attributes": {{<laterality|location|severity|change>: <value>}}}}]}}.\n\n{sentences}'
)


class LLMUnusable(Exception):
    """The endpoint's answer cannot be turned into facts."""


@dataclass
class LLMFactExtractor:
    """`extract(text) -> ReportFacts` through an OpenAI-compatible chat endpoint, with a rule-based fallback."""

    url: str  # base URL, e.g. http://127.0.0.1:8000/v1
    model: str = "default"
    api_key: str | None = None
    timeout_s: float = 30.0
    calls: int = 0
    failures: int = 0
    last_error: str | None = None

    def extract(self, text: str) -> ReportFacts:
        self.calls += 1
        sentences = split_sentences(text or "")
        if not sentences:
            return ReportFacts(text=text or "", sentences=[])
        try:
            return ReportFacts(text=text, sentences=sentences, facts=self._facts(text, sentences))
        except (OSError, ValueError, LookupError, TypeError, LLMUnusable) as exc:  # URLError and timeouts are OSErrors
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return extract_facts(text)

    def _facts(self, text: str, sentences: list[Sentence]) -> list[Fact]:
        numbered = "\n".join(f"{s.index}. {s.text}" for s in sentences)
        prompt = PROMPT.format(observations=", ".join(CONCEPTS), sentences=numbered)
        answer = self._chat(prompt)
        match = re.search(r"\{.*\}", answer, re.S)  # tolerate prose or code fences around the JSON
        if not match:
            raise LLMUnusable("no JSON object in the answer")
        items = json.loads(match.group())["facts"]
        facts = []
        for item in items:
            index = int(item["sentence"])
            if not 0 <= index < len(sentences):
                raise LLMUnusable(f"no sentence {index}")
            sentence = sentences[index]
            observation, polarity = item["observation"], item["polarity"]
            if observation not in CONCEPTS or polarity not in (POSITIVE, NEGATIVE, UNCERTAIN):
                raise LLMUnusable(f"unknown observation or polarity: {observation!r}, {polarity!r}")
            mention = str(item.get("mention") or "")
            offset = sentence.text.lower().find(mention.lower()) if mention else -1
            start = sentence.start + max(offset, 0)
            end = start + len(mention) if offset >= 0 else sentence.end
            attributes = {str(k): str(v) for k, v in (item.get("attributes") or {}).items()}
            facts.append(Fact(observation, polarity, attributes, sentence.index, start, end, text[start:end]))
        return facts

    def _chat(self, prompt: str) -> str:
        body = json.dumps(
            {"model": self.model, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url.rstrip("/") + "/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise LLMUnusable(f"HTTP {exc.code}") from None
        return payload["choices"][0]["message"]["content"]
