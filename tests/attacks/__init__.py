"""Attacks on the reward: patches that leave a task's bug in place and try to make its grade say `resolved`, each
first shown to fool the plain test runner (tests/attacks/plain.py), then graded by patchgym."""
