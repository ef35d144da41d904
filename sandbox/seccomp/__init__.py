"""Seccomp: the policy a jail runs under, compiled to classic BPF on the host."""
