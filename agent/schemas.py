"""The paper's three tools as data: names, descriptions and JSON parameter schemas, as sent to the model.

Pure data, imported wherever the tools are named or checked (the loop, the tools, the argument checks,
the gym environment); no process of its own and nothing to bound. Names, schemas and their order match
the reference package, so its prompts and models trained on it carry over.
"""

from __future__ import annotations

from typing import Any

ANSWER_PATH = "/testbed/output/answer.txt"
EDITOR_COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]

_EDITOR_DESCRIPTION = """Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists \
non-hidden files and directories up to 2 levels deep
* The `create` command cannot be used if the specified `path` already exists
* If a `command` generates a long output, its middle is elided and marked with `[... N characters elided ...]`
* The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful \
of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to \
include enough context in `old_str` to make it unique
* The `new_str` parameter should contain the edited lines that should replace the `old_str`
"""

_BASH_DESCRIPTION = """Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. For example: `python my_script.py`.
"""

_SUBMIT_DESCRIPTION = f"""A simple submit tool to finish tasks.

This tool signals completion of a task or submission of results. Write the final answer to {ANSWER_PATH} \
(and any other outputs to its directory) before calling it.
No parameters required - simply call to indicate task completion.
"""

STR_REPLACE_EDITOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "str_replace_editor",
        "description": _EDITOR_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "description": "The command to run. Allowed options are: "
                    + ", ".join(f"`{c}`" for c in EDITOR_COMMANDS)
                    + ".",
                    "enum": EDITOR_COMMANDS,
                    "type": "string",
                },
                "path": {
                    "description": "Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`.",
                    "type": "string",
                },
                "file_text": {
                    "description": "Required for the `create` command, contains the content of the file to be created.",
                    "type": "string",
                },
                "old_str": {
                    "description": "Required for the `str_replace` command, specifies the string in `path` to replace.",
                    "type": "string",
                },
                "new_str": {
                    "description": "Optional for the `str_replace` command to specify the replacement string. "
                    "Required for the `insert` command to specify the string to insert.",
                    "type": "string",
                },
                "insert_line": {
                    "description": "Required for the `insert` command. The `new_str` will be inserted AFTER the line "
                    "specified; 0 inserts at the top of the file.",
                    "type": "integer",
                },
                "view_range": {
                    "description": "Optional for the `view` command when `path` points to a file. Specifies the line "
                    "range to view. E.g., [11, 12] shows lines 11 and 12. Indexing starts at 1. Use [start_line, -1] "
                    "to show all lines from `start_line` to the end.",
                    "type": "array",
                    "items": {"type": "integer"},
                },
            },
            "required": ["command", "path"],
        },
    },
}

EXECUTE_BASH_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute_bash",
        "description": _BASH_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The command (and optional arguments) to execute. "
                    "For example: 'python my_script.py'",
                }
            },
            "required": ["command"],
        },
    },
}

SUBMIT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": _SUBMIT_DESCRIPTION,
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}

TOOL_SCHEMAS: list[dict[str, Any]] = [STR_REPLACE_EDITOR_SCHEMA, EXECUTE_BASH_SCHEMA, SUBMIT_SCHEMA]
"""In the reference's order: chat templates render tools in the order given, so prompts stay the same."""

PARAMETERS: dict[str, dict[str, Any]] = {s["function"]["name"]: s["function"]["parameters"] for s in TOOL_SCHEMAS}
"""Each tool's parameter schema, by tool name."""

EXAMPLES = {
    "execute_bash": '{"command": "ls /testbed"}',
    "str_replace_editor": '{"command": "view", "path": "/testbed"}',
    "submit": "{}",
}
"""A well-formed call of each tool, for the error observations that say what is expected."""

EDITOR_REQUIRES = {
    "view": (),
    "create": ("file_text",),
    "str_replace": ("old_str",),
    "insert": ("insert_line", "new_str"),
    "undo_edit": (),
}
"""The parameters each ``str_replace_editor`` command needs besides ``command`` and ``path``."""
