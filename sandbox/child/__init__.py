"""The child side: what the launcher (``python -I -S``) imports and the jail's init runs. Stdlib and the floor only."""
