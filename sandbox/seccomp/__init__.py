"""Seccomp: the policy a jail runs under, compiled to classic BPF on the host.

``policy`` (the ``SeccompPolicy`` model), ``syscalls`` (this machine's names and numbers, which the
policy checks against) and ``bpf`` (the compiler, over both), in that order of dependence.
"""
