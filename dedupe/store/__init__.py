"""The store: the only code that talks to the dedup Redis (clients, the script runners, the Lua
scripts in ``lua/``, one per state transition, and the replies they give).

Imports: ``values`` and the leaves (``dedupe.errors``, ``dedupe.events``).
"""
