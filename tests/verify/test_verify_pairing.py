"""Scores stay with their trajectories when answers come back out of order (R2E-Gym zipped completion-ordered
scores with input-ordered trajectories): a fake OpenAI-compatible server answers each judge prompt with the P(YES)
written in that trajectory's patch, after a random delay, many requests in flight."""

import json
import math
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from patchgym.inference.models import load_tokenizer
from patchgym.inference.openai_engine import OpenAIEngine
from patchgym.verify.config import VerifierConfig
from patchgym.verify.execution_free import score_trajectories, verdict_ids
from patchgym.verify.select import Candidate, choose

SCORE = re.compile(r"score=(0\.\d+)")


class FakeJudge(ThreadingHTTPServer):
    """Answers /v1/completions (token ids) and /v1/chat/completions (messages) with top logprobs; records the
    order in which requests arrive and finish."""

    daemon_threads = True

    def __init__(self, tokenizer, yes: int, no: int, seed: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tokenizer, self.yes, self.no = tokenizer, yes, no
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.arrived: list[str] = []
        self.finished: list[str] = []

    def answer(self, prompt_text: str) -> list[tuple[str, float]]:
        score = SCORE.search(prompt_text).group(1)
        with self.lock:
            self.arrived.append(score)
            delay = self.rng.uniform(0.0, 0.3)
        time.sleep(delay)
        with self.lock:
            self.finished.append(score)
        p = float(score)
        # One label by id (vLLM --return-tokens-as-token-ids), the other by its text, plus a distractor.
        return [(f"token_id:{self.yes}", math.log(p)), (self.tokenizer.decode([self.no]), math.log(1 - p)),
                ("maybe", -7.0)]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        judge: FakeJudge = self.server
        if self.path == "/v1/completions":
            top = judge.answer(judge.tokenizer.decode(body["prompt"]))
            choice = {"index": 0, "text": "Y", "finish_reason": "length",
                      "logprobs": {"tokens": ["Y"], "token_logprobs": [top[0][1]], "text_offset": [0],
                                   "top_logprobs": [dict(top)]}}
            payload = {"id": "x", "object": "text_completion", "created": 0, "model": body["model"],
                       "choices": [choice]}
        else:
            top = judge.answer(json.dumps(body["messages"]))
            content = [{"token": "Y", "logprob": top[0][1], "bytes": None,
                        "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top]}]
            choice = {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "Y"},
                      "logprobs": {"content": content}}
            payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                       "choices": [choice]}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_scores_stay_with_their_trajectories_when_answers_arrive_shuffled(api, make_trajectory):
    tokenizer = load_tokenizer("smollm2")
    config = VerifierConfig(max_requests=8)
    yes, no = verdict_ids(tokenizer, config)
    rng = random.Random(7)
    truth = {}
    candidates = {}
    for i in range(16):
        p = round(rng.uniform(0.01, 0.99), 4)
        task = f"task-{i % 4}"
        key = f"run{i % 2}/{task}#{i}"
        truth[key] = p
        candidates[key] = (make_trajectory(task, i, resolved=False, patch=f"--- a/x.py\n+++ b/x.py\n# score={p}\n"),
                           None)
    server = FakeJudge(tokenizer, yes, no, seed=1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        engine = OpenAIEngine(f"http://127.0.0.1:{server.server_address[1]}/v1", "judge", tokenizer, api=api,
                              max_retries=0)
        scores = score_trajectories(engine, candidates, config)
        engine.close()
    finally:
        server.shutdown()
        server.server_close()
    assert server.finished != server.arrived, "the delays did not shuffle the answers: the test proves nothing"
    assert sorted(server.finished) == sorted(str(p) for p in truth.values())
    assert set(scores) == set(truth)
    for key, p in truth.items():
        assert scores[key] == pytest.approx(p, abs=1e-9), key
    # And the choice made from them is the one the true scores make.
    for task in {f"task-{i}" for i in range(4)}:
        pool = [Candidate(key, False, scores[key]) for key in scores if f"/{task}#" in key]
        best = max((key for key in truth if f"/{task}#" in key), key=truth.get)
        assert choose(pool, "ef").id == best
