"""The training harness, above the library: the command line (``directload ...``), the training runs of
both frameworks, the experiments and benchmarks' plumbing, the memory cap and the plots.

Nothing in the library imports it; it uses the library only through its public modules.
"""
