"""Repository layer: one module per table, each SQL statement in exactly one place.

Functions take a connection and return facts (row counts, frozen dataclasses); services
decide what the facts mean (STYLE practice 1).
"""
