"""Values and pure functions: settings, options, keys, records, headers, times. No I/O.

Imports: only this folder and the leaves at the top of the package (``dedupe.errors``,
``dedupe.events``).
"""
