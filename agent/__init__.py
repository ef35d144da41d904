"""jailbox's LLM agent: the paper's loop driving an OpenAI-compatible model through three tools in a jail.

``loop.Agent`` runs one model (any ``loop.ChatModel``; ``llm.LLMClient`` is one) in one ``Sandbox``
until it submits; ``run.run_task`` is one task end to end; ``batch.Batch`` runs many, scored, on an
executor (``executors``, ``ray_executor``); ``environment.Environment`` is the gym-style view for
trainers. The tools are ``tools.Tools`` (schemas in ``schemas``, pure text in ``text``).

This package runs in host processes only and uses the jail only through its public API: the names
of ``jailbox.sandbox.__all__`` (``from ..sandbox import Sandbox, ...``) and ``jailbox.sandbox.errors``,
never the sandbox's private modules.
"""
