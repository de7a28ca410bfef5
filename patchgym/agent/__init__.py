"""Agents: policies that read observations and answer with one tool call per turn."""
