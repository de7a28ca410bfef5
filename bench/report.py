"""What the bench scripts share: how each prints its one result (a JSON object with --json, else one aligned
`key: value` line each), a median timer, and the chat prompts the generation benches sample from."""

import json
import statistics
import time

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a unit test is.",
    "How do I undo the last git commit?",
    "What does HTTP status 404 mean?",
    "Name three sorting algorithms.",
    "What is a race condition?",
    "Why is the sky blue?",
]


def median_ms(fn, n: int) -> float:
    """Median wall time of `fn()` over `n` calls, in milliseconds, after one warm-up call."""
    fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
