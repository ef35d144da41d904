"""``jailbox serve``: one host process that holds sandboxes for clients that talk to it over HTTP.

Runs in the serving host process only (never in a jail). ``e2b/`` speaks the E2B API (the control
plane and the in-sandbox daemon's Connect RPC), so the E2B SDKs drive jailbox unchanged. Nothing is
imported here: ``jailbox serve`` loads what it needs when it starts.
"""
