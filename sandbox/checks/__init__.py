"""Host checks: the probes, ``jailbox doctor`` and the diagnosis of refused setup steps."""
