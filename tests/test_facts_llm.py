"""The optional LLM extractor against a tiny OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orapo_core.facts import score_report
from orapo_core.facts.llm import LLMFactExtractor


class FakeLLM(BaseHTTPRequestHandler):
    answer = ""  # set per test: the assistant message content
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        if type(self).answer is None:
            self.send_response(500)
            self.end_headers()
            return
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": type(self).answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def server():
    FakeLLM.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeLLM)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_llm_facts_are_used(server):
    FakeLLM.answer = (
        "```json\n"
        + json.dumps(
            {
                "facts": [
                    {
                        "sentence": 1,
                        "mention": "effusion",
                        "observation": "Pleural Effusion",
                        "polarity": "uncertain",
                        "attributes": {"laterality": "left"},
                    }
                ]
            }
        )
        + "\n```"
    )
    extractor = LLMFactExtractor(url=server, model="local")
    report = extractor.extract("Heart normal. Tiny left effusion.")
    assert extractor.failures == 0 and extractor.calls == 1
    (fact,) = report.facts
    assert (fact.observation, fact.polarity, fact.sentence_index, fact.mention) == (
        "Pleural Effusion",
        "uncertain",
        1,
        "effusion",
    )
    path, body = FakeLLM.requests[0]
    assert (
        path == "/v1/chat/completions"
        and body["model"] == "local"
        and "1. Tiny left effusion." in body["messages"][0]["content"]
    )
    # The same extractor plugs into scoring.
    assert (
        score_report("Heart normal. Tiny left effusion.", labels={"Pleural Effusion": 1}, extractor=extractor).recall
        == 1.0
    )


@pytest.mark.parametrize(
    "answer",
    [
        None,  # HTTP 500
        "I cannot help with that.",  # no JSON
        json.dumps({"facts": [{"sentence": 0, "observation": "Gout", "polarity": "positive"}]}),  # unknown observation
        json.dumps({"facts": [{"sentence": 9, "observation": "Edema", "polarity": "positive"}]}),  # no such sentence
    ],
)
def test_llm_failures_fall_back_and_are_counted(server, answer):
    FakeLLM.answer = answer
    extractor = LLMFactExtractor(url=server)
    report = extractor.extract("No pneumothorax.")
    assert extractor.failures == 1 and extractor.last_error
    assert [(f.observation, f.polarity) for f in report.facts] == [
        ("Pneumothorax", "negative")
    ]  # the rule-based answer


def test_unreachable_endpoint_falls_back():
    extractor = LLMFactExtractor(url="http://127.0.0.1:9/v1", timeout_s=2)
    assert [f.observation for f in extractor.extract("Small effusion.").facts] == ["Pleural Effusion"]
    assert extractor.failures == 1
