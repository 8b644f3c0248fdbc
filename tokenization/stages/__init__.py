"""The stages, each a plain function of its config: ``tokenize`` (a rank), ``merge``, ``context_shuffle``, ``count``
and ``verify``.
"""
