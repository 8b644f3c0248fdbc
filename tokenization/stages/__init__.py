"""The stages, each a plain function of its config: ``tokenize`` (a package: a rank, with its first pass, the hits
it checks, its document shuffle and the segments they hand on), ``merge`` (a package: its config, inputs, plan, moves
and resume), ``context_shuffle``, ``count``, ``export_mds`` (a build's windows as MDS) and ``verify`` (the audit of a
folder's records against its files and each other).
"""
