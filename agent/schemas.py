"""The paper's three tools as data: names, descriptions and JSON parameter schemas, as sent to the model.

Pure data, imported wherever the tools are named or checked (the loop, the tools, the argument checks,
the gym environment); no process of its own and nothing to bound. Names, schemas and their order match
the reference package, so its prompts and models trained on it carry over.
"""

from __future__ import annotations

from typing import Any

ANSWER_PATH = "/testbed/output/answer.txt"
EDITOR_COMMANDS = ["view", "create", "str_replace", "insert"]
UNDO = "undo_edit"

_EDITOR_DESCRIPTION = """Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists \
non-hidden files and directories up to 2 levels deep
* The `create` command writes `file_text` and a final newline, replacing any file already at `path`
* If a `command` generates a long output, it is cut off and marked with `<response clipped>`

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

_UNDO_NOTE = "* The `undo_edit` command will revert the last edit made to the file at `path`\n"


_EDITOR_PROPERTIES: dict[str, Any] = {
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
}


def editor_schema(undo: bool = False) -> dict[str, Any]:
    """The ``str_replace_editor`` schema; ``undo`` adds the ``undo_edit`` command (not in the reference)."""
    commands = [*EDITOR_COMMANDS, UNDO] if undo else EDITOR_COMMANDS
    description = _EDITOR_DESCRIPTION.replace("\n\nNotes", f"\n{_UNDO_NOTE}\nNotes") if undo else _EDITOR_DESCRIPTION
    return {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {
                        "description": "The command to run. Allowed options are: "
                        + ", ".join(f"`{c}`" for c in commands)
                        + ".",
                        "enum": list(commands),
                        "type": "string",
                    },
                    **_EDITOR_PROPERTIES,
                },
                "required": ["command", "path"],
            },
        },
    }


STR_REPLACE_EDITOR_SCHEMA = editor_schema()

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


def tool_schemas(undo: bool = False) -> list[dict[str, Any]]:
    """The three tools in the reference's order: chat templates render tools in the order given."""
    return [editor_schema(undo), EXECUTE_BASH_SCHEMA, SUBMIT_SCHEMA]


def parameters(schemas: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tool's parameter schema, by tool name."""
    return {s["function"]["name"]: s["function"]["parameters"] for s in schemas}


TOOL_SCHEMAS = tool_schemas()
"""What the model is offered by default: the reference's tools, byte for byte in names, schemas and order."""

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
    UNDO: (),
}
"""The parameters each ``str_replace_editor`` command needs besides ``command`` and ``path``."""

PARAMETERS = parameters(TOOL_SCHEMAS)
"""Each default tool's parameter schema, by tool name."""
