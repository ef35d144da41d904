"""The floor: stdlib-only pieces every process role imports (syscall wrappers, the wire format)."""
