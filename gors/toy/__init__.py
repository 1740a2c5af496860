"""A toy compositional world where GORS measurably works on a CPU.

Scenes of one or two flat-coloured shapes on a white background, prompts in T2I-CompBench's
style, an exact scorer, and a tiny Stable Diffusion of the real classes pretrained on rendered
scenes (it draws shapes and colours but binds them imperfectly).
"""
