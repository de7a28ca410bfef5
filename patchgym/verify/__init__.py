"""Test-time scaling: verifiers that score candidate trajectories (execution-free P(YES), execution-based test
passes, and the DeepSWE hybrid), choosing one per task, Best@k against the Pass@k oracle, and verifier training.

Modules: config (the `verifier:` section), scoring (next-token logprobs from any engine), execution_free,
repro (reproduction tests from the issue), execution_based, select (the rules and Best@k), run (`patchgym select`),
train (`patchgym train-verifier`). This file imports none of them: patchgym.config imports verify.config.
"""
