"""Resource limits: rlimits planned per sandbox, and cgroups where the host lets us make them."""
