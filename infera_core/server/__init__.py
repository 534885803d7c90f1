"""The Infera server: OpenAI/Anthropic endpoints in front of the fleet.

Build it with :func:`infera_core.server.app.create_app`; run it with
:func:`infera_core.server.run.serve` (what ``infera-run serve`` does).
"""
