"""Measure a GPU (or, without one, a CPU on tiny shapes) with PyTorch and write an enginesim hardware profile.

Why inside enginesim: the profile's schema, the model shapes it measures and the cost model it feeds
are enginesim's, and enginesim is standard library only, so the whole package ships to a node as one
zipapp. torch is imported only here; the emulator itself never needs it. The map is in README.md.
"""
