"""The SWE environment: a task's workspace in a sandbox, the agent's four tools, and the grader."""
