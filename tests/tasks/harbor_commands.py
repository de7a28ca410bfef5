"""A scripted agent for the Harbor tests: the given shell commands, one per turn, then finish (a None among them is a
finish too, which ends a multi-step task's step)."""

from patchgym.env.tools.calls import ToolCall, render_call_xml


class Commands:
    def __init__(self, *commands: str | None):
        self.commands = commands

    def act(self, task, observation, turn):
        command = self.commands[turn] if turn < len(self.commands) else None
        return render_call_xml(ToolCall("execute_bash", {"command": command}) if command else ToolCall("finish", {}))
