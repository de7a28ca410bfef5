"""Evaluation: run a policy on tasks, grade every patch in a fresh sandbox, report resolve rates."""
