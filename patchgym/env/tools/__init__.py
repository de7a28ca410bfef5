"""The agent's four tools, host side: install the in-sandbox script, and run a parsed tool call through it."""

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from patchgym.env.tools.calls import (
    COMMAND_TIMEOUT_S,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    FormatError,
    ToolCall,
    parse_tool_call,
    render_call_json,
    render_call_xml,
    tool_schemas,
)
from patchgym.sandbox.standalone import standalone_source

TOOLS_DIR = "/opt/patchgym/tools"
SCRIPT_PATH = f"{TOOLS_DIR}/sandbox_tools.py"
SCRIPT_SOURCE = standalone_source(Path(__file__).parent / "sandbox_tools.py")
FINISHED = "<<< Finished >>>"
# Beyond the command's own timeout, what the script may take to kill it and answer.
SCRIPT_GRACE_S = 30.0
# Linux caps one command-line argument at 128 KiB; longer arguments (a big file_text) travel in a file.
MAX_ARGV_CHARS = 100_000


@dataclass(frozen=True)
class ToolResult:
    observation: str  # what the model sees next
    exit_code: int | None  # execute_bash: the command's (124 = timed out); other tools: 0, or 1 on error; finish: None
    done: bool  # the agent called finish


def install_tools(sandbox) -> None:
    """Put the tools script into the sandbox (one file write; safe to repeat)."""
    sandbox.write_file(SCRIPT_PATH, SCRIPT_SOURCE, mode=0o755)


def run_tool(sandbox, call: ToolCall, *, timeout: float = COMMAND_TIMEOUT_S,
             python: str = "python3") -> ToolResult:
    """Run `call` in the sandbox; `timeout` bounds the command (execute_bash) or the directory walk (search)."""
    if call.name == "finish":  # submit too: parse_tool_call gives it as finish
        return ToolResult(FINISHED, None, True)
    args = json.dumps(call.arguments)
    if len(args) > MAX_ARGV_CHARS:
        # Beside the script, where only root writes (the next long call of this tool overwrites it): in a folder the
        # agent can write, a link it left in the file's place would have this root write go wherever it points.
        args_file = f"{TOOLS_DIR}/args-{call.name}.json"
        sandbox.write_file(args_file, args)
        args = "@" + args_file
    # -I: the task's PYTHON* variables (a PYTHONPATH into the repository, say) must not change how the tools run.
    keep = ["keep"] if sandbox.config.keep_background else []  # background jobs live on (a Harbor task's sandbox)
    result = sandbox.exec([python, "-I", SCRIPT_PATH, call.name, args, f"{timeout:g}", *keep],
                          timeout=timeout + SCRIPT_GRACE_S, agent=True)
    if result.timed_out:
        return ToolResult(f"Execution output of [{call.name}]:\nERROR: the tool did not answer within "
                          f"{timeout + SCRIPT_GRACE_S:g} s and was stopped.", 124, False)
    if result.signal is not None and not result.output.startswith(("Exit code: ", "Execution output of [")):
        # The script itself was killed: by the agent's command (`kill -9 -1` ends all of the agent's processes,
        # the script's too) or by the memory limit. The agent's doing, answered like a failed command.
        why = "out of memory" if result.oom_killed else f"signal {result.signal}, sent by the command itself"
        return ToolResult(f"Execution output of [{call.name}]:\nERROR: the tool's process was killed ({why}).\n"
                          f"{result.output.strip()[-2000:]}".rstrip(), result.exit_code, False)
    if not result.output.startswith(("Exit code: ", "Execution output of [")):
        # No observation at all: the script is missing, the interpreter is, or the script crashed (a bug of ours).
        raise RuntimeError(f"{sandbox.id}: the {call.name} tool did not run with {shlex.quote(python)} (exit "
                           f"{result.exit_code}): {result.output.strip()[-500:]}; was install_tools(sandbox) called?")
    return ToolResult(result.output.removesuffix("\n"), result.exit_code, False)


__all__ = ["COMMAND_TIMEOUT_S", "TOOLS_DIR", "TOOL_NAMES", "TOOL_SCHEMAS", "FormatError", "ToolCall", "ToolResult",
           "install_tools", "parse_tool_call", "render_call_json", "render_call_xml", "run_tool", "tool_schemas"]
