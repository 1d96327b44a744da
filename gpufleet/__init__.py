"""The operator CLI (typer + rich): command modules only: parse, call, print.

Each ``*_cmd.py`` parses its options, calls one function of a lower layer (``review``,
``safety``, ``preview``, ``jobs``, ``vault_policies``, ``experiments``) and prints what it
returns; a rule (what to refuse, what to scan by default, when a watch ends) belongs to that
layer, where tests and the control plane reach it without the CLI. ``cli.py`` wires the
commands; ``console.py`` gives every module the same consoles.
"""
