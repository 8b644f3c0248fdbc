"""A record's text: a field, a template over its fields, or a chat (``renderer``), rendered in a bounded Jinja2
sandbox (``sandbox``), with the ranges that carry no loss. Imports ``errors`` only.
"""
