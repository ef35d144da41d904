"""The LLM agent loop (coming with its issue). Uses ``sandbox`` only through its public API."""
